"""Step-time overhead of tracing, per parallel mode, measured so it can be trusted (issue 14).

    python benchmarks/step_overhead.py                       # every mode, 3 rounds
    python benchmarks/step_overhead.py --mode TP+SP --rounds 5 --steps 40

Each round runs every variant once, in an order that rotates from round to round (so a
variant is not always the one that runs on a warm or a busy machine):
- bare:   the reference trainer on plain ranks (torchrun's environment, no distdoctor);
- tracer: the same ranks with the tracer installed (the recorder in every rank), but no
          `distdoctor run` process: what the ranks themselves pay;
- run:    the whole thing, under `distdoctor run --nproc` (the live loop, the output scan,
          the probes sampler, py-spy on a hang).
A run's step time is the median over its steps after --warmup (rank 0's log). A variant's
ratio in a round is its step time over bare's of the same round; the table gives the median
ratio over rounds and its spread (min-max). `run - tracer` is what `run`'s own process
costs the ranks (it shares the cores with them).

On a 2-core machine every mode with more ranks than cores time-slices: these are ratios of
overheads on a tiny model, not scaling.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

from distdoctor.reference_trainer.launch import launch
from distdoctor.reference_trainer.train import parse_step_log

from distdoctor.launch.env import traced_env
from distdoctor.runlog import rundir

MOE = ["--experts", "4", "--ep", "2"]
MODES = {  # name: (ranks, flags)
    "DDP": (2, ["--dp", "2"]),
    "FSDP2": (2, ["--fsdp", "2"]),
    "TP+SP": (2, ["--tp", "2"]),
    "PP gpipe": (2, ["--pp", "2", "--schedule", "gpipe"]),
    "PP 1f1b": (2, ["--pp", "2", "--schedule", "1f1b"]),
    "PP interleaved": (2, ["--pp", "2", "--schedule", "interleaved1f1b"]),
    "DDP+EP": (2, ["--dp", "2", *MOE]),
    "HSDP": (4, ["--dp", "2", "--fsdp", "2"]),
    "8-rank demo": (8, ["--dp", "2", "--tp", "2", "--pp", "2", *MOE]),
}
MODEL = ["--layers", "4", "--dim", "64", "--heads", "4", "--seq-len", "32", "--vocab", "128",
         "--batch-size", "8"]
VARIANTS = ("bare", "tracer", "run")


def step_ms(variant: str, nproc: int, flags: list[str], args) -> float:
    """Median step time (ms) of one run of the trainer."""
    common = ["--steps", str(args.steps), "--timeout-s", "120", *MODEL, *flags]
    with tempfile.TemporaryDirectory(prefix="bench-overhead-") as tmp:
        if variant == "run":
            proc = subprocess.run(
                [sys.executable, "-m", "distdoctor", "run", "--nproc", str(nproc), "--run-dir",
                 os.path.join(tmp, "run"), "--", sys.executable, "-m",
                 "distdoctor.reference_trainer", *common],
                capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL)
            ok, out, err = proc.returncode == 0, proc.stdout, proc.stderr
        else:
            env = None
            if variant == "tracer":
                run_dir = rundir.claim_run_dir(os.path.join(tmp, "run"), "bench")
                rundir.write_run_meta(run_dir, launcher="benchmark", command=["trainer"],
                                      nproc=nproc, world_size=nproc, hang_timeout_s=60.0,
                                      on_hang="report")
                env = traced_env(run_dir)
            result = launch(nproc, common, timeout_s=900, env=env, start="subprocess")
            ok, out, err = result.ok, result.stdout[0], result.tail()
    steps = [s["ms"] for s in parse_step_log(out) if s["step"] > args.warmup]
    if not ok or not steps:
        raise RuntimeError(f"{variant} {flags} failed:\n{err[-2000:]}")
    return statistics.median(steps)


def measure(name: str, args) -> dict[str, list[float]]:
    """Per variant, its ratio to bare in each round."""
    nproc, flags = MODES[name]
    ratios: dict[str, list[float]] = {v: [] for v in VARIANTS if v != "bare"}
    bare_ms: list[float] = []
    for rnd in range(args.rounds):
        order = VARIANTS[rnd % 3:] + VARIANTS[:rnd % 3]
        ms = {v: step_ms(v, nproc, flags, args) for v in order}
        bare_ms.append(ms["bare"])
        for v in ratios:
            ratios[v].append(ms[v] / ms["bare"])
    return {"bare_ms": bare_ms, **ratios}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", action="append", choices=sorted(MODES),
                    help="only this mode (repeatable; default: all)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5, help="first steps left out")
    args = ap.parse_args()
    print(f"{args.rounds} rounds x {len(VARIANTS)} variants, {args.steps} steps (median after "
          f"{args.warmup}); {os.cpu_count()} CPU cores")
    print(f"{'mode':<16} {'ranks':>5} {'bare ms':>8}  {'tracer/bare':>18}  {'run/bare':>18}")
    for name in args.mode or list(MODES):
        try:
            r = measure(name, args)
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            print(f"{name:<16} FAILED", flush=True)
            print(str(exc)[-1500:], file=sys.stderr)
            continue

        def cell(xs: list[float]) -> str:
            return f"{statistics.median(xs):.3f} ({min(xs):.2f}-{max(xs):.2f})"

        print(f"{name:<16} {MODES[name][0]:>5} {statistics.median(r['bare_ms']):>8.1f}  "
              f"{cell(r['tracer']):>18}  {cell(r['run']):>18}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
