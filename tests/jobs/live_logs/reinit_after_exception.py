"""In-process restart: every rank catches the same exception, logs it with its traceback
(rank 1 a second after rank 0), tears its process group down and makes a new one within a
second (a new incarnation of the job, a new log per rank), then trains on for about
ARGV[1] seconds and exits 0."""

import logging
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
x = torch.ones(4)
dist.all_reduce(x)
time.sleep(rank)  # rank 1's report comes after rank 0's: an update of the same finding
try:
    raise RuntimeError("lost the data loader's worker: restarting in process")
except RuntimeError:
    logging.exception("step failed")
dist.barrier()
dist.destroy_process_group()
# the restart meets at a file store of its own: the first one's port may still be taken
store = os.path.join(tempfile.gettempdir(), f"reinit-{os.environ['MASTER_PORT']}")
dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
for _ in range(int(float(sys.argv[1]) / 0.05)):  # as many on every rank
    time.sleep(0.05)
    dist.all_reduce(x)
dist.destroy_process_group()
if rank == 0:
    os.unlink(store)
