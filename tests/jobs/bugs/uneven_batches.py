"""The last rank gets one batch fewer (a sampler without drop_last) and leaves the loop early."""
import sys

import torch.distributed as dist

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _common import grads, init  # noqa: E402

rank, world = init()
batches = 8 - (1 if rank == world - 1 else 0)
for _step in range(batches):
    dist.all_reduce(grads(32))  # expect: others
dist.barrier()  # expect: culprit
