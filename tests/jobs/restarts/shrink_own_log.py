"""Ranks that rewrite their own event logs under the readers (truncate them in place, as
a job's clean-up code might), then live on for a moment: no reader may die of it."""

import os
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(2)
for _ in range(5):
    dist.all_reduce(t)
dist.barrier()
path = os.path.join(os.environ["DISTDOCTOR_RUN_DIR"], "ranks", f"rank-{rank:05d}.ring")
os.truncate(path, 8192)  # header and a page of strings: the ring is gone
time.sleep(2)  # let the readers meet the shrunk files (this rank records nothing more)
os._exit(0)
