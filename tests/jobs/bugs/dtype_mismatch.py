"""One rank keeps its gradients in float64 (a .double() left in one code path)."""
import sys

import torch.distributed as dist

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _common import grads, init  # noqa: E402

rank, world = init()
for step in range(5):
    g = grads(64)
    if rank == 2 and step == 2:
        g = g.double()
        dist.all_reduce(g)  # expect: culprit
    else:
        dist.all_reduce(g)  # expect: others
