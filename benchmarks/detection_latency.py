"""Detection latency: from the diverging call to the finding on disk (findings.json).

Goals (issue 4): a mismatch within 2 s; a hang within the hang timeout + 2 s. A real
4-rank gloo job under `distdoctor run`: rank 1 notes the wall time just before it
diverges (a different collective, or no collective at all), and this script polls the run
dir's findings.json until the finding is there.

  python benchmarks/detection_latency.py [--hang-timeout 5] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

JOB = textwrap.dedent("""
    import datetime, os, sys, time
    import torch, torch.distributed as dist
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    rank = dist.get_rank()
    for step in range(5):
        dist.all_reduce(torch.ones(64))
    if rank == 1:
        open(sys.argv[2], "w").write(repr(time.time()))
        if sys.argv[1] == "mismatch":
            dist.all_reduce(torch.ones(65))  # a different size from the others
        else:
            time.sleep(600)  # never joins
    else:
        dist.all_reduce(torch.ones(64))
""")


def one(kind: str, hang_timeout: float, tmp: Path) -> float:
    job, mark, run_dir = tmp / "job.py", tmp / "mark", tmp / f"run-{kind}-{time.time_ns()}"
    job.write_text(JOB)
    mark.unlink(missing_ok=True)
    proc = subprocess.Popen(
        [sys.executable, "-m", "distdoctor", "run", "--nproc", "4", "--run-dir", str(run_dir),
         "--hang-timeout", str(hang_timeout), "--on-hang", "kill", "--grace", "1", "--",
         str(job), kind, str(mark)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    found_at = None
    try:
        deadline = time.time() + 120
        while time.time() < deadline and found_at is None:
            try:
                findings = json.loads((run_dir / "findings.json").read_text())["findings"]
                if any(f["kind"] == kind and 1 in f["ranks"] for f in findings):
                    found_at = time.time()
            except (OSError, ValueError, KeyError):
                pass
            time.sleep(0.01)
    finally:
        proc.wait(timeout=120)
    if found_at is None:
        raise SystemExit(f"{kind}: no finding within 120 s")
    return found_at - float(mark.read_text())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hang-timeout", type=float, default=5.0)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for kind, budget in (("mismatch", 2.0), ("hang", args.hang_timeout + 2.0)):
            lat = sorted(one(kind, args.hang_timeout, Path(tmp)) for _ in range(args.repeat))
            print(f"{kind}: from the diverging call to findings.json in "
                  f"{', '.join(f'{x:.2f}' for x in lat)} s (worst {lat[-1]:.2f} s; goal "
                  f"<= {budget:g} s: {'met' if lat[-1] <= budget else 'NOT met'}"
                  + (f"; hang timeout {args.hang_timeout:g} s" if kind == "hang" else "")
                  + ")")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
