"""Detection latency: from the diverging call to the finding on disk (findings.json).

Goals (issue 4): a mismatch within 2 s; a hang within the hang timeout + 2 s. A real
4-rank gloo job under `distdoctor run`: rank 1 notes the wall time just before it
diverges (a different collective, or no collective at all), and this script polls the run
dir's findings.json until the finding is there.

  python benchmarks/detection_latency.py [--hang-timeout 5] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import textwrap
from pathlib import Path

from hang_detection import time_to_finding  # this folder: run as a script

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
    job = tmp / "job.py"
    job.write_text(JOB)
    return time_to_finding(job, kind, tmp, str(hang_timeout),
                           lambda f: f["kind"] == kind and 1 in f["ranks"],
                           nproc=4, limit_s=120, poll_s=0.01)


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
