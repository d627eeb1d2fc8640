"""Tracing overhead, as ratios measured in one run (numbers go in docs/benchmarks.md).

1. Paired, 2 gloo ranks, 1-element all_reduce: in ONE pair of traced processes, blocks
   of 100 ops alternate between the traced world group and a plain twin of it that
   shares its gloo backend (exactly torch's untraced path). Both see the same process
   placement and the same neighbours, so the ratio of their medians is the tracer's cost
   on this op; separate launches differ from each other by more than that (+-15% here).
2. Launched, 2 gloo ranks: untraced, distdoctor (traced, no `run`), under `distdoctor run`
   (its live diagnosis following the ranks on the same cores), TORCH_DISTRIBUTED_DEBUG=
   DETAIL and the Flight Recorder, each in its own processes (the latter two cannot be
   switched on for one group only), interleaved REPEATS times, median kept; and
   distdoctor's two rows against the Flight Recorder round by round.
3. The tracer's own cost per call: torch's fake backend (no communication and no worker
   thread), traced minus untraced time per call; and paired, in ONE traced process:
   blocks of 1,000 calls alternate between the traced group and its plain twin, timed
   in the thread's CPU time (a loaded machine's waits for a core left out), median of
   the blocks. A world of one on gloo is no good for
   this: its worker-thread hand-off makes any few microseconds of Python on the calling
   thread cost several times that.

   The ratio itself differs between launches by up to +-0.1 on this 2-core VM (where the
   ranks land, what else runs), so the median of --launches launches is the number, with
   its quartiles as the spread.

4. Before and after (--before DIR: a checkout of an earlier commit, its C extension
   built in place, `python setup.py build_ext --inplace`): parts 1 and 3 alternate
   launch by launch between that tree and this one, so both see the same machine.

    python benchmarks/tracer_overhead.py [--iters 3000] [--repeats 5] [--rounds 150]
                                         [--launches 15] [--before DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

WORKER = os.path.abspath(__file__)


def worker(iters: int, fake: bool) -> None:
    import torch
    import torch.distributed as dist

    if fake:
        from torch.testing._internal.distributed.fake_pg import FakeStore

        from distdoctor.tracer import install

        install._BUILTIN_BACKENDS.add("fake")  # trace it here, as gloo is traced
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
    else:
        dist.init_process_group("gloo")
    t = torch.ones(1)
    for _ in range(200):
        dist.all_reduce(t)
    dist.barrier()
    best = float("inf")
    for _ in range(3 if fake else 1):  # fake: nothing but CPU, so the best of 3 is its cost
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t)
        best = min(best, time.perf_counter() - start)
    if dist.get_rank() == 0:
        print(f"US_PER_OP {best / iters * 1e6:.3f}")
    dist.destroy_process_group()


def paired_worker(rounds: int) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo")
    traced = dist.group.WORLD
    assert type(traced).__name__ == "TracingProcessGroup", "run me under distdoctor"
    plain = traced._dd_twin()  # the same gloo backend, torch's own untraced path
    plain_us, traced_us = _alternate(traced, plain, rounds, 200, 100, time.perf_counter)
    if dist.get_rank() == 0:
        print(f"PAIRED {plain_us:.3f} {traced_us:.3f}")
    dist.destroy_process_group()


def _alternate(traced, plain, rounds: int, warmup: int, block: int, clock) -> tuple:
    """(plain, traced) microseconds per 1-element all_reduce, the median over `rounds`
    blocks of `block` calls each side, the sides' order alternating by round, timed by
    `clock` (the wall's or the thread's CPU)."""
    import torch
    import torch.distributed as dist

    t = torch.ones(1)
    for _ in range(warmup):
        dist.all_reduce(t, group=traced)
        dist.all_reduce(t, group=plain)
    times = {"traced": [], "plain": []}
    for rnd in range(rounds):
        for name in ("traced", "plain") if rnd % 2 else ("plain", "traced"):
            group = traced if name == "traced" else plain
            start = clock()
            for _ in range(block):
                dist.all_reduce(t, group=group)
            times[name].append((clock() - start) / block * 1e6)
    return statistics.median(times["plain"]), statistics.median(times["traced"])


def fake_paired_worker(rounds: int) -> None:
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from distdoctor.tracer import install

    install._BUILTIN_BACKENDS.add("fake")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
    traced = dist.group.WORLD
    assert type(traced).__name__ == "TracingProcessGroup", "run me traced"
    plain = traced._dd_twin()
    plain_us, traced_us = _alternate(traced, plain, rounds, 2000, 1000, time.thread_time)
    print(f"FAKE_PAIRED {plain_us:.3f} {traced_us:.3f}")
    dist.destroy_process_group()


def fake_paired(rounds: int, tree: str | None = None) -> tuple[float, float]:
    for line in _spawn(1, ["--fake-paired", str(rounds)], {}, True, tree).splitlines():
        if line.startswith("FAKE_PAIRED"):
            plain, traced = map(float, line.split()[1:])
            return plain, traced
    raise RuntimeError("fake paired worker printed nothing")


def _spawn(nproc: int, worker_args: list[str], extra_env: dict, traced: bool,
           tree: str | None = None) -> str:
    """Run the worker on `nproc` local ranks (with distdoctor from checkout `tree`, this
    one by default); rank 0's output."""
    from distdoctor.launch.env import free_port, rank_env, traced_env

    base = {k: v for k, v in os.environ.items() if not k.startswith(("DISTDOCTOR", "TORCH_"))}
    base.update(extra_env)
    worker = WORKER
    if tree is not None:
        tree = os.path.abspath(tree)
        worker = os.path.join(tree, "benchmarks", os.path.basename(WORKER))
        base["PYTHONPATH"] = os.pathsep.join(
            [os.path.join(tree, "distdoctor", "launch", "bootstrap"), tree])
    env = traced_env(tempfile.mkdtemp(prefix="dd-bench-"), base) if traced else base
    if tree is not None:  # the earlier tree's own bootstrap, not this one's
        env["PYTHONPATH"] = base["PYTHONPATH"]
    port = free_port()
    procs = [subprocess.Popen([sys.executable, worker, *worker_args],
                              env=rank_env(env, r, nproc, port), stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True, stdin=subprocess.DEVNULL)
             for r in range(nproc)]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError(f"worker failed: {outs}")
    return outs[0]


def _under_run(nproc: int, worker_args: list[str], extra_env: dict) -> str:
    """The worker launched by `distdoctor run --nproc`; what the ranks printed (relayed)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("DISTDOCTOR", "TORCH_"))}
    base.update(extra_env)
    with tempfile.TemporaryDirectory(prefix="dd-bench-run-") as tmp:
        done = subprocess.run(
            [sys.executable, "-m", "distdoctor", "run", "--nproc", str(nproc), "--run-dir",
             os.path.join(tmp, "run"), "--", sys.executable, WORKER, *worker_args],
            env=base, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=600)
    if done.returncode:
        raise RuntimeError(f"distdoctor run failed: {done.stderr[-2000:]}")
    return "\n".join(line[line.index("US_PER_OP"):] for line in
                     (done.stdout + done.stderr).splitlines() if "US_PER_OP" in line)


def paired(rounds: int, tree: str | None = None) -> tuple[float, float]:
    for line in _spawn(2, ["--paired", str(rounds)], {}, True, tree).splitlines():
        if line.startswith("PAIRED"):
            plain, traced = map(float, line.split()[1:])
            return plain, traced
    raise RuntimeError("paired worker printed nothing")


def launch(nproc: int, iters: int, extra_env: dict, traced: bool | str,
           fake: bool = False) -> float:
    """us per op of rank 0; `traced`: False, True (traced, no `run`), or "run" (launched by
    `distdoctor run --nproc`, its live diagnosis following the ranks beside them)."""
    worker_args = ["--worker", str(iters), *(["--fake"] if fake else [])]
    out = (_under_run(nproc, worker_args, extra_env) if traced == "run"
           else _spawn(nproc, worker_args, extra_env, traced))
    for line in out.splitlines():
        if line.startswith("US_PER_OP"):
            return float(line.split()[1])
    raise RuntimeError(f"worker printed nothing: {out}")


# torch 2.13 records gloo ops in its own Flight Recorder by default (2,000 entries):
# "untraced" and "distdoctor" switch it off, the Flight Recorder row sets it explicitly
_NO_FR = {"TORCH_FR_BUFFER_SIZE": "0"}
CONFIGS = {
    "untraced": (_NO_FR, False),
    "distdoctor": (_NO_FR, True),
    "distdoctor run (its live diagnosis beside)": (_NO_FR, "run"),
    "TORCH_DISTRIBUTED_DEBUG=DETAIL": ({"TORCH_DISTRIBUTED_DEBUG": "DETAIL", **_NO_FR}, False),
    "Flight Recorder (TORCH_FR_BUFFER_SIZE=20000)": ({"TORCH_FR_BUFFER_SIZE": "20000"}, False),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=3000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--rounds", type=int, default=150)
    ap.add_argument("--launches", type=int, default=15)
    ap.add_argument("--fake", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--paired", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--fake-paired", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--only", choices=["paired", "launched", "per-call"],
                    help="one part of the three")
    ap.add_argument("--before", metavar="DIR",
                    help="an earlier checkout: paired parts alternate with it, launch by launch")
    args = ap.parse_args()
    if args.worker:
        return worker(args.worker, args.fake)
    if args.paired:
        return paired_worker(args.paired)
    if args.fake_paired:
        return fake_paired_worker(args.fake_paired)
    print(f"load average {os.getloadavg()[0]:.2f} at the start")
    if args.only in (None, "per-call"):
        per_call(args)
    if args.only == "per-call":
        return None

    if args.only in (None, "paired"):
        paired_report(args)
    if args.only in (None, "launched"):
        launched_report(args)


def _trees(args) -> list:
    """(label, checkout) of each tree measured, alternating launch by launch."""
    return [("before", args.before), ("after", None)] if args.before else [("", None)]


def paired_report(args) -> None:
    print(f"paired: 2 gloo ranks, all_reduce(1 element), {args.rounds} x 2 alternating blocks "
          f"of 100 ops per launch, {args.launches} launches")
    ratios = {label: [] for label, _ in _trees(args)}
    for _ in range(args.launches):
        for label, tree in _trees(args):
            plain, traced = paired(args.rounds, tree)
            ratios[label].append(traced / plain)
            print(f"  {label:6s} plain twin {plain:7.1f} us/op   traced {traced:7.1f} us/op   "
                  f"ratio {traced / plain:5.3f}")
    for label, rs in ratios.items():
        q1, med, q3 = statistics.quantiles(rs, n=4) if len(rs) > 1 else rs * 3
        print(f"  {label:6s} median ratio {statistics.median(rs):5.3f} (quartiles "
              f"{q1:5.3f}-{q3:5.3f}, range {min(rs):5.3f}-{max(rs):5.3f})")
    print(f"  (load {os.getloadavg()[0]:.2f})\n")


def launched_report(args) -> None:
    print(f"launched: 2 gloo ranks, {args.iters} x all_reduce(1 element), median of "
          f"{args.repeats} launches each")
    times = {name: [] for name in CONFIGS}
    names = list(CONFIGS)
    for rnd in range(args.repeats):
        # the order turns by one each round: a launch's place in its round (after the
        # slow DETAIL one, first after a pause) weighs on every configuration alike
        for name in names[rnd % len(names):] + names[:rnd % len(names)]:
            env, traced = CONFIGS[name]
            times[name].append(launch(2, args.iters, env, traced))
    base = statistics.median(times["untraced"])
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"  {name:46s} {med:8.1f} us/op   ratio {med / base:5.3f}")
    # each round's configurations ran back to back: a ratio within a round leaves out the
    # machine's drift between rounds (the launches' own spread is +-15% here)
    fr = next(name for name in CONFIGS if name.startswith("Flight Recorder"))
    for name in ("distdoctor", "distdoctor run (its live diagnosis beside)"):
        rs = [a / b for a, b in zip(times[name], times[fr], strict=True)]
        q1, _, q3 = statistics.quantiles(rs, n=4) if len(rs) > 1 else rs * 3
        print(f"  {name} / Flight Recorder, round by round: median {statistics.median(rs):5.3f}"
              f" (quartiles {q1:5.3f}-{q3:5.3f}; {sum(r <= 1 for r in rs)} of {len(rs)} "
              f"rounds no slower)")
    print(f"  (load {os.getloadavg()[0]:.2f})")


def per_call(args) -> None:
    print(f"the tracer's own cost, paired in one process: fake backend, {args.launches} "
          "launches of 60 alternating blocks of 1,000 calls (thread CPU time)")
    runs = {label: [] for label, _ in _trees(args)}
    for _ in range(args.launches):
        for label, tree in _trees(args):
            plain, traced = fake_paired(60, tree)
            runs[label].append((traced - plain, traced / plain))
            print(f"  {label:6s} plain {plain:6.2f} us/call   traced {traced:6.2f} us/call   "
                  f"+{traced - plain:5.2f} us   ratio {traced / plain:5.3f}")
    for label, rs in runs.items():
        print(f"  {label:6s} median +{statistics.median(d for d, _ in rs):.2f} us per call, "
              f"ratio {statistics.median(r for _, r in rs):5.3f}")
    print(f"  (load {os.getloadavg()[0]:.2f})\n")
    if args.before:
        return
    print(f"the tracer's own cost: fake backend (no communication), {args.iters * 10} "
          f"calls, median of {args.repeats}")
    one = {"untraced": [], "traced": []}
    for _ in range(args.repeats):
        one["untraced"].append(launch(1, args.iters * 10, {}, False, fake=True))
        one["traced"].append(launch(1, args.iters * 10, {}, True, fake=True))
    u, t = statistics.median(one["untraced"]), statistics.median(one["traced"])
    print(f"  untraced {u:.2f} us/call, traced {t:.2f} us/call: tracing adds "
          f"{t - u:.2f} us per call")


if __name__ == "__main__":
    main()
