"""Validation on rank 0 only broadcasts a metric the others never ask for."""
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _common import grads, init  # noqa: E402

rank, world = init()


def validate(step):
    metric = torch.tensor([float(step)])
    dist.broadcast(metric, src=0)  # expect: culprit
    return metric


for step in range(6):
    g = grads()
    dist.all_reduce(g)  # expect: others
    if step == 3 and rank == 0:  # the bug: only rank 0 validates
        validate(step)
dist.barrier()
