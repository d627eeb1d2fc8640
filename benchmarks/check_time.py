"""How long `distdoctor check --nproc N` takes on this machine (goal: <= 30 s for 8
ranks), and what it found: N local gloo ranks, the whole check (rendezvous, facts, the
all-reduce, clock offsets, the best of three pairwise sweeps).

    python benchmarks/check_time.py [--nproc 8] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nproc", type=int, default=8)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    for _ in range(args.runs):
        t0 = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "distdoctor", "check", "--json",
                               "--nproc", str(args.nproc)], capture_output=True, text=True,
                              stdin=subprocess.DEVNULL, timeout=300)
        wall = time.monotonic() - t0
        report = json.loads(proc.stdout)
        print(f"check --nproc {args.nproc}: {wall:.1f} s wall (the check says "
              f"{report['seconds']:.1f} s), exit {proc.returncode}, {report['counts']}")


if __name__ == "__main__":
    main()
