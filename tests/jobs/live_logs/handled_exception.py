"""A rank that catches an exception, logs it with its traceback (logging.exception) and goes
on: every rank trains on (100 all-reduces, or for ARGV[1] seconds) and exits 0."""

import logging
import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
if rank == 0:
    try:
        raise RuntimeError("checkpoint upload failed: connection reset")  # expect: raise
    except RuntimeError:
        logging.exception("upload failed, retrying")
x = torch.ones(4)
for _ in range(100):
    dist.all_reduce(x)
end = time.monotonic() + (float(sys.argv[1]) if len(sys.argv) > 1 else 0)
while time.monotonic() < end:  # the same on every rank: they stop within a step
    time.sleep(0.05)
    dist.all_reduce(x)
dist.destroy_process_group()
