"""A rank that catches an exception, logs it with its traceback (logging.exception) and goes
on: every rank trains on and exits 0."""

import logging

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
dist.destroy_process_group()
