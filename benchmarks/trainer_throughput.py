"""Reference trainer throughput: tokens/s per parallel configuration on CPU (gloo).

    python benchmarks/trainer_throughput.py                    # the default table
    python benchmarks/trainer_throughput.py --only 8 --steps 20
    python benchmarks/trainer_throughput.py --with-tracing     # + a column under `distdoctor run`

Each configuration runs as real ranks (fresh processes, torchrun's environment), on the
same small model. Throughput is global tokens per step / step time, from rank 0's log,
median over the steps after --warmup. Peak memory is the sum over the rank processes of
RSS (counts shared library pages once per process) and PSS (shares them out: what the
ranks really cost together), sampled every 0.2 s.

On a 2-core machine every configuration with more ranks than cores time-slices, so these
numbers compare the *overheads* of the parallelisms (collectives, DTensor dispatch,
pipeline bubbles) on a tiny model, not their scaling. With --with-tracing the traced and
untraced runs alternate, and the ratio is taken within one invocation.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import psutil
from distdoctor.reference_trainer.launch import launch
from distdoctor.reference_trainer.train import parse_step_log

MOE = ["--experts", "4", "--ep", "2"]
CONFIGS = [  # (ranks, label, flags)
    (1, "single rank", []),
    (2, "DDP", ["--dp", "2"]),
    (2, "FSDP2", ["--fsdp", "2"]),
    (2, "TP+SP", ["--tp", "2"]),
    (2, "PP gpipe", ["--pp", "2", "--schedule", "gpipe"]),
    (2, "PP 1f1b", ["--pp", "2", "--schedule", "1f1b"]),
    (2, "PP interleaved1f1b", ["--pp", "2", "--schedule", "interleaved1f1b"]),
    (2, "DDP + EP (MoE)", ["--dp", "2", *MOE]),
    (4, "HSDP", ["--dp", "2", "--fsdp", "2"]),
    (4, "DDP x TP", ["--dp", "2", "--tp", "2"]),
    (4, "DDP x PP", ["--dp", "2", "--pp", "2"]),
    (8, "DDP", ["--dp", "8"]),
    (8, "FSDP x TP x PP", ["--fsdp", "2", "--tp", "2", "--pp", "2"]),
    (8, "DDP x TP x PP + EP (MoE)", ["--dp", "2", "--tp", "2", "--pp", "2", *MOE]),
]


class MemorySampler(threading.Thread):
    """Peak of the summed RSS / PSS of every process whose command line runs the trainer."""

    def __init__(self, marker: str = "distdoctor.reference_trainer"):
        super().__init__(daemon=True)
        self.marker, self.peak_rss, self.peak_pss = marker, 0, 0
        self._done = threading.Event()

    def run(self):
        me = os.getpid()
        while not self._done.is_set():
            rss = pss = 0
            for p in psutil.process_iter(["pid", "cmdline"]):
                if p.info["pid"] == me or self.marker not in " ".join(p.info["cmdline"] or []):
                    continue
                try:
                    full = p.memory_full_info()
                    rss, pss = rss + full.rss, pss + getattr(full, "pss", full.rss)
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    pass
            self.peak_rss, self.peak_pss = max(self.peak_rss, rss), max(self.peak_pss, pss)
            self._done.wait(0.2)

    def stop(self):
        self._done.set()
        self.join()


def measure(nproc: int, flags: list[str], args, traced: bool) -> dict:
    common = ["--steps", str(args.steps), "--timeout-s", "60", *args.model, *flags]
    sampler = MemorySampler()
    sampler.start()
    if traced:
        with tempfile.TemporaryDirectory(prefix="bench-trace-") as run_dir:
            proc = subprocess.run(
                [sys.executable, "-m", "distdoctor", "run", "--nproc", str(nproc), "--run-dir",
                 run_dir, "--", sys.executable, "-m", "distdoctor.reference_trainer", *common],
                capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL)
        ok, out, err = proc.returncode == 0, proc.stdout, proc.stderr
    else:
        result = launch(nproc, common, timeout_s=900, start="subprocess")
        ok, out, err = result.ok, result.stdout[0], result.tail()
    sampler.stop()
    steps = [s for s in parse_step_log(out) if s["step"] > args.warmup]
    if not ok or not steps:
        raise RuntimeError(f"{flags} failed:\n{err[-3000:]}")
    return {"tokens_per_s": statistics.median(s["tokens_per_s"] for s in steps),
            "ms": statistics.median(s["ms"] for s in steps),
            "rss_gib": sampler.peak_rss / 2**30, "pss_gib": sampler.peak_pss / 2**30}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5, help="first steps left out")
    parser.add_argument("--only", type=int, action="append", help="only configs with N ranks")
    parser.add_argument("--with-tracing", action="store_true",
                        help="also run each config under `distdoctor run` (ratio column)")
    args = parser.parse_args()
    args.model = ["--layers", "4", "--dim", "64", "--heads", "4", "--seq-len", "32",
                  "--vocab", "128", "--batch-size", "8"]
    print(f"model: {' '.join(args.model)}; {args.steps} steps, median after {args.warmup}; "
          f"{os.cpu_count()} CPU cores; torch threads 1 per rank")
    header = f"{'ranks':>5}  {'configuration':<26} {'tok/s':>8} {'ms/step':>8} " \
             f"{'RSS GiB':>8} {'PSS GiB':>8}"
    if args.with_tracing:
        header += f" {'traced tok/s':>13} {'traced/untraced':>16}"
    print(header)
    for nproc, label, flags in CONFIGS:
        if args.only and nproc not in args.only:
            continue
        try:
            r = measure(nproc, flags, args, traced=False)
        except RuntimeError as exc:
            print(f"{nproc:>5}  {label:<26} FAILED", flush=True)
            print(str(exc)[-1500:], file=sys.stderr)
            continue
        line = (f"{nproc:>5}  {label:<26} {r['tokens_per_s']:>8.0f} {r['ms']:>8.1f} "
                f"{r['rss_gib']:>8.2f} {r['pss_gib']:>8.2f}")
        if args.with_tracing:
            try:
                t = measure(nproc, flags, args, traced=True)
                ratio = t["tokens_per_s"] / r["tokens_per_s"]
                line += f" {t['tokens_per_s']:>13.0f} {ratio:>16.3f}"
            except (RuntimeError, subprocess.TimeoutExpired) as exc:
                line += f" {'FAILED':>13}"
                print(str(exc)[-1500:], file=sys.stderr)
        print(line, flush=True)
    return 0


if __name__ == "__main__":
    start = time.monotonic()
    code = main()
    print(f"total {time.monotonic() - start:.0f} s")
    sys.exit(code)
