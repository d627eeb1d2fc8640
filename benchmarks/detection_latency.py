"""Detection latency: from the diverging call to the finding on disk (findings.json).

Goals (issue 4): a mismatch within 2 s; a hang within the hang timeout + 2 s. A real
4-rank gloo job under `distdoctor run`: rank 1 notes the wall time just before it
diverges (a different collective, or no collective at all), and this script polls the run
dir's findings.json until the finding is there. "busy mismatch": 2 ranks issuing 1,000
collectives a second each (torch's fake backend) that go on after rank 1's odd one: the
live loop's passes as large as a busy job makes them.

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


# A busy job (the run_budget.py ranks: torch's fake backend, 1,000 all-reduces a second
# each, traced as gloo is) whose rank 1 broadcasts once where rank 0 all-reduces, and
# both go on: the ops keep flowing, so the live loop's passes stay as large as the job
# makes them (live.py CPU_SHARE) and the finding waits for the next one.
BUSY = textwrap.dedent("""
    import os, sys, time
    import torch, torch.distributed as dist
    import torch.testing._internal.distributed.fake_pg  # registers "fake"
    from distdoctor.tracer import install
    install._BUILTIN_BACKENDS.add("fake")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                          world, is_master=rank == 0)
    dist.init_process_group("fake", store=store, rank=rank, world_size=world)
    t = torch.ones(16)
    def ops(seconds, rate=1000):
        end, next_t = time.monotonic() + seconds, time.monotonic()
        while time.monotonic() < end:
            for _ in range(10):
                dist.all_reduce(t)
            next_t += 10 / rate
            time.sleep(max(0.0, next_t - time.monotonic()))
    ops(4)
    if rank == 1:
        open(sys.argv[2], "w").write(repr(time.time()))
        dist.broadcast(t, 0)
    else:
        dist.all_reduce(t)
    ops(6)
    dist.destroy_process_group()
""")


def one(kind: str, hang_timeout: float, tmp: Path) -> float:
    if kind == "busy mismatch":
        job = tmp / "busy.py"
        job.write_text(BUSY)
        return time_to_finding(job, "busy", tmp, None, lambda f: f["kind"] == "mismatch",
                               nproc=2, limit_s=120, poll_s=0.01)
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
        for kind, budget in (("mismatch", 2.0), ("busy mismatch", 2.0),
                             ("hang", args.hang_timeout + 2.0)):
            lat = sorted(one(kind, args.hang_timeout, Path(tmp)) for _ in range(args.repeat))
            print(f"{kind}: from the diverging call to findings.json in "
                  f"{', '.join(f'{x:.2f}' for x in lat)} s (worst {lat[-1]:.2f} s; goal "
                  f"<= {budget:g} s: {'met' if lat[-1] <= budget else 'NOT met'}"
                  + (f"; hang timeout {args.hang_timeout:g} s" if kind == "hang" else "")
                  + ")")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
