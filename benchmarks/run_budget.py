"""What `distdoctor run`'s own process costs: CPU of one core while it follows a busy job.

    python benchmarks/run_budget.py [--ranks 8] [--rate 1000] [--seconds 12]

The job: `distdoctor run --nproc RANKS` of ranks that each issue RATE traced all-reduces a
second (in bursts of 10 every 10 ms) for SECONDS. The ranks use torch's fake backend, so
they cost the machine next to nothing and never wait on each other: everything `run` has
to do (read every event of every rank, match each op across the ranks, check liveness,
sample the probes, relay and scan the output) is there, at a rate a 2-core machine could
not drive through gloo. Measured: the CPU time of `run`'s process (all its threads) and
of the guardian it starts, over the job's steady middle (from 1.5 s after every rank has
its log to 1.5 s before the ranks stop),
as a share of one core. Goal (issue 49): at most 1% at 2 ranks x 1,000 collectives/s,
growing no faster than the event rate; `--rate 0`: an idle job (the ranks sleep).

`--baseline DIR`: a copy of the package to compare (`git archive OLD distdoctor probes |
tar -x -C DIR`, and the built extension copied in; its probes/ is linked in as
distdoctor/probes, else the editable install would lend it this tree's): each round runs
it and the working tree back to back (A/B interleaved, on the same loaded machine), and
the report gives both shares and their ratio, with the load average of each round.

`--sweep`: issue 49's table in one run: 2, 8 and 32 ranks (`--ranks-list`) at 100, 1,000
and 10,000 collectives/s a rank (`--rates`), each row A/B against `--baseline` when given.
The events are counted from the rank logs' heads over the window (what the ranks really
issued: on 2 cores, many ranks at a high rate fall short of the rate asked), so the CPU
per event is per event read.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time


def rank(rate: int, seconds: float) -> None:
    import torch
    import torch.distributed as dist
    import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers "fake")

    from distdoctor.tracer import install

    install._BUILTIN_BACKENDS.add("fake")  # trace it as gloo is traced
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # a real store, shared as a real job's is: the ranks agree on their run dir and launch
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                          is_master=rank == 0)
    dist.init_process_group("fake", store=store, rank=rank, world_size=world)
    t = torch.ones(16)
    if rate <= 0:  # an idle job: initialised, then waiting on something else
        time.sleep(seconds)
        dist.destroy_process_group()
        return
    burst, period = 10, 10 / rate
    deadline = time.monotonic() + seconds
    next_t = time.monotonic()
    while time.monotonic() < deadline:
        for _ in range(burst):
            dist.all_reduce(t)
        next_t += period
        delay = next_t - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    dist.destroy_process_group()


def cpu_seconds(pid: int) -> float:
    """The CPU time of the process's threads (not its children), to the nanosecond
    (schedstat; its stat counts clock ticks: 10 ms, 0.06% of a core over a 17 s window,
    the size of the effects measured here). A thread that ends within the window would
    be missed: run's are all started before it opens."""
    return sum(thread_cpu(pid).values())


def thread_cpu(pid: int) -> dict[int, float]:
    """The CPU time of each thread of the process (schedstat: nanoseconds)."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                out[int(tid)] = int(f.read().split()[0]) / 1e9
        except (OSError, ValueError, IndexError):
            continue
    return out


def thread_names(pid: int) -> dict[int, str]:
    """Thread id -> Python thread name, from one `py-spy dump` (none without py-spy):
    which of run's threads (diagnosis, probe sampler, output relays, main loop) costs
    what."""
    import re
    import shutil

    spy = shutil.which("py-spy") or os.path.join(os.path.dirname(sys.executable), "py-spy")
    try:
        out = subprocess.run([spy, "dump", "--pid", str(pid)], capture_output=True,
                             text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    return {int(tid): name for tid, name in re.findall(r'Thread (\d+) \([^)]*\): "([^"]*)"', out)}


def children(pid: int) -> list[int]:
    out = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(p) for p in f.read().split()]
        except OSError:
            pass
    return out


def guardians(run_pid: int) -> list[int]:
    """run's own helper processes (not the ranks): the guardian."""
    found = []
    for pid in children(run_pid):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"guardian" in f.read():
                    found.append(pid)
        except OSError:
            pass
    return found


def events_written(ranks_dir: str) -> int:
    """Events the ranks have written so far (their logs' heads)."""
    from distdoctor.runlog.reader import RankLog

    total = 0
    for name in os.listdir(ranks_dir):
        if name.endswith(".ring"):
            try:
                log = RankLog(os.path.join(ranks_dir, name))
                total += log.header().head
                log.close()
            except Exception:
                pass
    return total


def measure(ranks: int, rate: int, seconds: float, pythonpath: str | None) -> tuple:
    """(share of one core, CPU us per event, the job's exit, its last lines, by thread,
    events a second)."""
    env = dict(os.environ)
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (pythonpath, env.get("PYTHONPATH"))
                                            if p)
    with tempfile.TemporaryDirectory(prefix="bench-run-budget-") as tmp:
        run = subprocess.Popen(
            [sys.executable, "-m", "distdoctor", "run", "--nproc", str(ranks),
             "--run-dir", os.path.join(tmp, "run"), "--", sys.executable,
             os.path.abspath(__file__), "--rank", str(rate), str(seconds)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            text=True, env=env, cwd=tmp)
        # the window opens once every rank has its log (torch imported: seconds on a
        # loaded machine) and has issued ops for a second, so it holds the steady middle
        ranks_dir = os.path.join(tmp, "run", "ranks")
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and run.poll() is None:
            try:
                if sum(n.endswith(".ring") for n in os.listdir(ranks_dir)) >= ranks:
                    break
            except OSError:
                pass
            time.sleep(0.2)
        time.sleep(1.5)
        helpers = guardians(run.pid)
        pids = [run.pid, *helpers]
        names = thread_names(run.pid)
        e0 = events_written(ranks_dir)
        c0, t0 = sum(cpu_seconds(p) for p in pids), time.monotonic()
        th0 = thread_cpu(run.pid)
        window = max(1.0, seconds - 3.0)  # the ranks' last seconds and exit left out
        time.sleep(window)
        c1, t1 = sum(cpu_seconds(p) for p in pids), time.monotonic()
        th1 = thread_cpu(run.pid)
        e1 = events_written(ranks_dir)
        out, _ = run.communicate(timeout=300)
    share = (c1 - c0) / (t1 - t0)
    events = max(1.0, e1 - e0)
    by_thread: dict[str, float] = {}
    for tid, cpu in th1.items():
        name = names.get(tid, "other")
        name = "distdoctor-tee" if name.startswith("distdoctor-tee") else name
        by_thread[name] = by_thread.get(name, 0.0) + (cpu - th0.get(tid, 0.0)) / (t1 - t0)
    return (share, (c1 - c0) / events * 1e6, run.returncode, out.strip().splitlines()[-3:],
            by_thread, events / (t1 - t0))


def link_probes(baseline: str) -> None:
    """The copy's probes/ as its distdoctor/probes (see --baseline)."""
    src, dst = os.path.join(baseline, "probes"), os.path.join(baseline, "distdoctor", "probes")
    if os.path.isdir(src) and not os.path.exists(dst):
        os.symlink(os.path.join("..", "probes"), dst)


def row(sides, ranks: int, rate: int, seconds: float, r: int) -> dict:
    """One measurement of each side, in turn (the order alternates with the round)."""
    got = {}
    for name, path in sides if r % 2 == 0 else sides[::-1]:
        load = os.getloadavg()[0]
        share, per_event, code, tail, by_thread, rate_seen = measure(ranks, rate, seconds,
                                                                     path)
        got[name] = share
        print(f"{name}: {ranks} ranks x {rate} collectives/s: run's process used "
              f"{share * 100:.2f}% of one core ({per_event:.2f} us per event, "
              f"{rate_seen:.0f} events/s read); job exit {code}; load {load:.2f}", flush=True)
        print("  by thread: " + ", ".join(
            f"{n} {v * 100:.2f}%" for n, v in sorted(by_thread.items(), key=lambda kv: -kv[1])))
        if code:
            print("  " + "\n  ".join(tail))
    return got


def main() -> int:
    if "--rank" in sys.argv:
        i = sys.argv.index("--rank")
        rank(int(sys.argv[i + 1]), float(sys.argv[i + 2]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--rate", type=int, default=1000, help="collectives per second per rank")
    ap.add_argument("--seconds", type=float, default=12.0)
    ap.add_argument("--baseline", help="a copy of the package to compare, A/B interleaved")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--sweep", action="store_true", help="every --ranks-list x --rates")
    ap.add_argument("--ranks-list", default="2,8,32")
    ap.add_argument("--rates", default="100,1000,10000")
    args = ap.parse_args()
    if args.baseline:
        link_probes(args.baseline)
    sides = [("baseline", os.path.abspath(args.baseline)), ("this tree", None)] \
        if args.baseline else [("this tree", None)]
    if args.sweep:
        table = []
        for ranks in map(int, args.ranks_list.split(",")):
            for rate in map(int, args.rates.split(",")):
                got = row(sides, ranks, rate, args.seconds, len(table))
                table.append((ranks, rate, got))
        print("\nranks x collectives/s: " + " | ".join(n for n, _ in sides)
              + (" | this tree / baseline" if args.baseline else ""))
        for ranks, rate, got in table:
            cells = [f"{got[n] * 100:.2f}%" for n, _ in sides]
            if args.baseline:
                cells.append(f"{got['this tree'] / got['baseline']:.2f}")
            print(f"{ranks} x {rate}: " + " | ".join(cells))
        return 0
    shares: dict[str, list[float]] = {name: [] for name, _ in sides}
    for r in range(args.rounds):
        for name, share in row(sides, args.ranks, args.rate, args.seconds, r).items():
            shares[name].append(share)
    for name, values in shares.items():
        values.sort()
        print(f"{name}: median {values[len(values) // 2] * 100:.2f}% of one core "
              f"({', '.join(f'{v * 100:.2f}' for v in values)})")
    if args.baseline:
        a, b = (sorted(shares[n])[len(shares[n]) // 2] for n in ("baseline", "this tree"))
        print(f"this tree / baseline: {b / a:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
