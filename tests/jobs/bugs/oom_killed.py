"""The kernel's OOM killer takes one rank (SIGKILL: no traceback, no cleanup)."""
import os
import signal
import sys

import torch.distributed as dist

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _common import grads, init  # noqa: E402

rank, world = init()
for step in range(6):
    if rank == 2 and step == 3:
        os.kill(os.getpid(), signal.SIGKILL)  # stands in for the OOM killer
    dist.all_reduce(grads())  # expect: site
