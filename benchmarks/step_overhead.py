"""Step-time overhead of tracing, per parallel mode, measured so it can be trusted (issue 14).

    python benchmarks/step_overhead.py                         # every mode
    python benchmarks/step_overhead.py --mode TP+SP --cycles 10

Separate launches of the same job differ by more than the effect (+-10-15% on this VM:
process placement, the machine's own drift), so the headline is measured **inside one
job**: the reference trainer runs under `distdoctor run --nproc`, and a global optimizer
step hook in every rank switches the cost sources on and off in blocks of --block steps,
the same steps on every rank:

- traced:   everything on (the recorder in the ranks, `run`'s process following them);
- recorder: the recorder on, `run`'s process stopped (SIGSTOP from local rank 0): what the
            ranks pay for recording;
- off:      the recorder off too (`tracer.state.recorder = None`): only the traced groups'
            interposition is left, which a group cannot shed once made.

The states rotate in cycles, each cycle in the reverse order of the one before. A ratio is
one state's median step over another's, all cycles pooled (each state's steps are spread
over the whole run, so the medians are paired by design), with a 90% bootstrap interval
over cycles as its spread. traced/off is the whole cost; traced/recorder is `run`'s
process (its live loop, the output scan, the probes sampler; py-spy runs only on a hang);
recorder/off is the recorder. The interposition, and everything else together, is in the
launched comparison (--rounds): the trainer bare and under `distdoctor run`, separate
launches in alternating order, median ratio over rounds.

On a 2-core machine every mode with more ranks than cores time-slices: these are ratios of
overheads on a tiny model, not scaling.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import runpy
import signal
import statistics
import subprocess
import sys
import tempfile
import time

MOE = ["--experts", "4", "--ep", "2"]
MODES = {  # name: (ranks, flags, steps per block: short steps get longer blocks)
    "DDP": (2, ["--dp", "2"], 12),
    "FSDP2": (2, ["--fsdp", "2"], 6),
    "HSDP": (4, ["--dp", "2", "--fsdp", "2"], 4),
    "TP+SP": (2, ["--tp", "2"], 3),
    "PP gpipe": (2, ["--pp", "2", "--schedule", "gpipe"], 12),
    "PP 1f1b": (2, ["--pp", "2", "--schedule", "1f1b"], 12),
    "PP interleaved": (2, ["--pp", "2", "--schedule", "interleaved1f1b"], 8),
    "DDP+EP": (2, ["--dp", "2", *MOE], 6),
    "8-rank demo": (8, ["--dp", "2", "--tp", "2", "--pp", "2", *MOE], 2),
}
MODEL = ["--layers", "4", "--dim", "64", "--heads", "4", "--seq-len", "32", "--vocab", "128",
         "--batch-size", "8", "--log-every", "1000"]
STATES = ("traced", "recorder", "off")
WARMUP_STEPS = 8


# --- in each rank --------------------------------------------------------------------
def in_rank(block: int, cycles: int, trainer_args: list[str]) -> None:
    """Run the trainer with a step hook that switches the states (see the docstring)."""
    from torch.optim.optimizer import register_optimizer_step_post_hook

    from distdoctor.tracer import state as tracer_state

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    run_pid = os.getppid()  # under `run --nproc`, the ranks are run's own children
    steps: list[tuple[str, int, float]] = []  # (state, cycle, seconds)
    saved = {"recorder": None}
    clock = {"last": None, "n": 0, "state": "traced"}

    def set_state(name: str) -> None:
        if saved["recorder"] is None:
            saved["recorder"] = tracer_state.recorder
        tracer_state.recorder = None if name == "off" else saved["recorder"]
        if local_rank == 0:
            os.kill(run_pid, signal.SIGCONT if name == "traced" else signal.SIGSTOP)
        clock["state"] = name

    def schedule(n: int) -> tuple[str, int] | None:
        """(state, cycle) of step n (counted from the end of warm-up), or None after."""
        cycle, pos = divmod(n // block, len(STATES))
        if cycle >= cycles:
            return None
        order = STATES if cycle % 2 == 0 else STATES[::-1]
        return order[pos], cycle

    def after_step(optimizer, args, kwargs) -> None:
        now = time.perf_counter()
        n = clock["n"] - WARMUP_STEPS  # the step that just ended
        if clock["last"] is not None and (where := schedule(n)) is not None and n >= 0:
            steps.append((where[0], where[1], now - clock["last"]))
        clock["n"] += 1
        nxt = schedule(clock["n"] - WARMUP_STEPS) if clock["n"] >= WARMUP_STEPS else None
        want = nxt[0] if nxt is not None else "traced"
        if want != clock["state"]:
            set_state(want)
        clock["last"] = time.perf_counter()

    register_optimizer_step_post_hook(after_step)
    sys.argv = ["distdoctor.reference_trainer", *trainer_args]
    try:
        runpy.run_module("distdoctor.reference_trainer", run_name="__main__", alter_sys=True)
    finally:
        if local_rank == 0:
            os.kill(run_pid, signal.SIGCONT)
        if int(os.environ.get("RANK", "0")) == 0:
            print("STEPLOG " + json.dumps(steps), flush=True)


# --- the benchmark -------------------------------------------------------------------
def trainer_args(flags: list[str], steps: int) -> list[str]:
    return ["--steps", str(steps), "--timeout-s", "120", *MODEL, *flags]


def in_job(name: str, args) -> dict:
    """The job's step log: {cycle: {state: [ms, ...]}}; and the block size used."""
    nproc, flags, block = MODES[name]
    block = args.block or block
    steps = WARMUP_STEPS + block * len(STATES) * args.cycles + 2
    with tempfile.TemporaryDirectory(prefix="bench-overhead-") as tmp:
        proc = subprocess.run(
            [sys.executable, "-m", "distdoctor", "run", "--nproc", str(nproc), "--run-dir",
             os.path.join(tmp, "run"), "--", sys.executable, os.path.abspath(__file__),
             "--in-rank", str(block), str(args.cycles), "--", *trainer_args(flags, steps)],
            capture_output=True, text=True, timeout=1800, stdin=subprocess.DEVNULL)
    logs = [line for line in proc.stdout.splitlines() if line.startswith("STEPLOG ")]
    if proc.returncode != 0 or not logs:
        raise RuntimeError(f"{name} failed (exit {proc.returncode}):\n{proc.stderr[-2000:]}")
    by_cycle: dict[int, dict[str, list[float]]] = {}
    for state, cycle, seconds in json.loads(logs[-1][len("STEPLOG "):]):
        by_cycle.setdefault(cycle, {}).setdefault(state, []).append(seconds * 1000)
    return {c: v for c, v in by_cycle.items() if len(v) == len(STATES)}


def ratio(by_cycle: dict, state: str, ref: str, resamples: int = 2000) -> tuple:
    """Median step of `state` over median step of `ref`, all cycles pooled (each state's
    steps are spread over the whole run, so the two medians are paired by design); and a
    90% bootstrap interval over cycles."""
    def pooled(cycles) -> float:
        a = [ms for c in cycles for ms in by_cycle[c][state]]
        b = [ms for c in cycles for ms in by_cycle[c][ref]]
        return statistics.median(a) / statistics.median(b)

    cycles = sorted(by_cycle)
    rng = random.Random(14)
    boot = sorted(pooled(rng.choices(cycles, k=len(cycles))) for _ in range(resamples))
    return pooled(cycles), boot[int(0.05 * resamples)], boot[int(0.95 * resamples) - 1]


def launched(name: str, args) -> tuple[float, list[float]]:
    """Bare and under `distdoctor run`, separate launches alternating: (bare ms, ratios)."""
    from distdoctor.reference_trainer.launch import launch
    from distdoctor.reference_trainer.train import parse_step_log

    nproc, flags, _ = MODES[name]
    targs = trainer_args(flags, args.launched_steps)

    def step_ms(variant: str) -> float:
        with tempfile.TemporaryDirectory(prefix="bench-overhead-") as tmp:
            if variant == "run":
                proc = subprocess.run(
                    [sys.executable, "-m", "distdoctor", "run", "--nproc", str(nproc),
                     "--run-dir", os.path.join(tmp, "run"), "--", sys.executable, "-m",
                     "distdoctor.reference_trainer", *targs, "--log-every", "1"],
                    capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL)
                ok, out, err = proc.returncode == 0, proc.stdout, proc.stderr
            else:
                result = launch(nproc, [*targs, "--log-every", "1"], timeout_s=900)
                ok, out, err = result.ok, result.stdout[0], result.tail()
        ms = [s["ms"] for s in parse_step_log(out) if s["step"] > WARMUP_STEPS]
        if not ok or not ms:
            raise RuntimeError(f"{name} {variant} failed:\n{err[-2000:]}")
        return statistics.median(ms)

    bare, ratios = [], []
    for rnd in range(args.rounds):
        order = ("bare", "run") if rnd % 2 == 0 else ("run", "bare")
        ms = {v: step_ms(v) for v in order}
        bare.append(ms["bare"])
        ratios.append(ms["run"] / ms["bare"])
    return statistics.median(bare), ratios


def cell(r: tuple) -> str:
    return f"{r[0]:.3f} ({r[1]:.2f}-{r[2]:.2f})"


def main() -> int:
    if "--in-rank" in sys.argv:
        i = sys.argv.index("--in-rank")
        block, cycles = int(sys.argv[i + 1]), int(sys.argv[i + 2])
        in_rank(block, cycles, sys.argv[sys.argv.index("--", i) + 1:])
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", action="append", choices=sorted(MODES),
                    help="only this mode (repeatable; default: all)")
    ap.add_argument("--block", type=int, help="steps per state in a cycle (default: by mode)")
    ap.add_argument("--cycles", type=int, default=24)
    ap.add_argument("--rounds", type=int, default=3,
                    help="launched comparison: rounds of bare + run (0: skip)")
    ap.add_argument("--launched-steps", type=int, default=40)
    args = ap.parse_args()
    print(f"in one job: {args.cycles} cycles x {len(STATES)} states x a block of steps "
          f"(after {WARMUP_STEPS} warm-up steps); launched: {args.rounds} rounds; "
          f"{os.cpu_count()} CPU cores; ratio (90% interval)", flush=True)
    print(f"{'mode':<15} {'ranks':>5} {'off ms':>7}  {'traced/off':>18}  {'recorder/off':>18}"
          f"  {'traced/recorder':>18}  {'launched run/bare':>18}", flush=True)
    for name in args.mode or list(MODES):
        started = time.monotonic()
        try:
            steps = in_job(name, args)
            bare_ms, launched_ratios = launched(name, args) if args.rounds else (0.0, [])
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            print(f"{name:<15} FAILED", flush=True)
            print(str(exc)[-1500:], file=sys.stderr)
            continue
        off_ms = statistics.median(ms for c in steps.values() for ms in c["off"])
        rl = (f"{statistics.median(launched_ratios):.3f} ({min(launched_ratios):.2f}-"
              f"{max(launched_ratios):.2f})") if launched_ratios else "-"
        print(f"{name:<15} {MODES[name][0]:>5} {off_ms:>7.1f}  "
              f"{cell(ratio(steps, 'traced', 'off')):>18}  "
              f"{cell(ratio(steps, 'recorder', 'off')):>18}  "
              f"{cell(ratio(steps, 'traced', 'recorder')):>18}  {rl:>18}   "
              f"[{len(steps)} cycles, {time.monotonic() - started:.0f} s]", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
