"""Rank 1 dies (os._exit(7)) while rank 0 waits in dist.barrier(): rank 0's gloo raises
"Connection closed by peer", whose traceback is the job's and torch's alone."""

import datetime
import os
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
t = torch.ones(2)
dist.all_reduce(t)
if dist.get_rank() == 1:
    time.sleep(0.5)
    os._exit(7)
dist.barrier()
