"""Rank 1 is stuck outside any collective (a long sleep) past the Gloo timeout, so rank 0's
all_reduce fails with Gloo's own "Timed out waiting ...ms for recv" error. Both ranks also
print marker output (stdout, stderr, a `\\r` progress line) that must pass through
`distdoctor run` unchanged.
"""

import datetime
import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=2))
rank = dist.get_rank()
dist.all_reduce(torch.ones(4))
print(f"marker-out rank {rank} \u00e9", flush=True)
print(f"marker-err rank {rank}", file=sys.stderr, flush=True)
sys.stdout.write(f"progress {rank} 50%\rprogress {rank} 100%\n")
sys.stdout.flush()
if rank == 1:
    time.sleep(10)  # the straggler: in no collective at all
    sys.exit(0)
dist.all_reduce(torch.ones(4))  # times out after 2 s: rank 1 never arrives
