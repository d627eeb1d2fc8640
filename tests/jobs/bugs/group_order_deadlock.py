"""Two groups over the same ranks, reduced in opposite orders on the two ranks."""
import sys

import torch.distributed as dist

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _common import grads, init  # noqa: E402

rank, world = init()
tp = dist.new_group([0, 1])
dp = dist.new_group([0, 1])
dist.all_reduce(grads(), group=tp)
dist.all_reduce(grads(), group=dp)
if rank == 0:
    dist.all_reduce(grads(), group=tp)  # expect: culprit
    dist.all_reduce(grads(), group=dp)
else:
    dist.all_reduce(grads(), group=dp)  # expect: culprit
    dist.all_reduce(grads(), group=tp)
