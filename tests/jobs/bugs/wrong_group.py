"""Rank 1 reduces on a sub-group where every other rank reduces on the world group."""
import sys

import torch.distributed as dist

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _common import grads, init  # noqa: E402

rank, world = init()
pair = dist.new_group([0, 1])
for step in range(3):
    dist.all_reduce(grads(), group=pair)
    g = grads(8)
    if rank == 1 and step == 2:
        dist.all_reduce(g, group=pair)  # expect: culprit
    else:
        dist.all_reduce(g)  # expect: others
dist.barrier()
