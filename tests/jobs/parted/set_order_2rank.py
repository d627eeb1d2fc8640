"""The same collectives in a different order on each rank: a loop over a Python set.

Each rank syncs its per-metric buffers by iterating `set(buffers)`; string hashing is
salted per process, so each rank walks the names in its own order and pairs its
`loss` all_reduce with the other's `tokens` (sizes differ: the collective fails or
hangs). Modelled on public reports of metric syncs over sets and dict keys built from
sets. No rank strayed: the order is the finding. 2 ranks.
"""
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _common import init  # noqa: E402

rank, world = init()
# a different hash salt per rank, as separate processes get without PYTHONHASHSEED
# (fixed here so that the two orders always differ)
names = ["loss", "tokens", "grad_norm", "lr"]
order = sorted(names) if rank == 0 else sorted(names, reverse=True)
buffers = {n: torch.ones(4 + 4 * i) for i, n in enumerate(names)}


class SaltedSet(set):
    def __iter__(self):  # what iterating a set of strings does across processes
        return iter(order)


dist.all_reduce(torch.ones(1))  # everyone is up
for _step in range(2):
    for name in SaltedSet(buffers):  # expect: loop
        dist.all_reduce(buffers[name])  # expect: op
dist.barrier()
