"""Two ranks take the two arms of one branch at the very first collective, and nothing
tells which arm was meant.

setup() shares the vocabulary: where a node has a cached vocabulary, rank 0 broadcasts
its size; where it has none, the ranks all_gather the sizes they counted. The cache is
on node 0's local disk only, so rank 0 broadcasts while rank 1 all-gathers. Both are in
setup(), in the same function, at their first op; no history, no rank ahead, same phase:
no evidence decides. A tie: both lines shown with equal weight, no one blamed. 2 ranks.
"""
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _common import init, scratch_dir  # noqa: E402

rank, world = init()
cache = os.path.join(scratch_dir("tie-vocab"), f"node{rank}")
os.makedirs(cache, exist_ok=True)
if rank == 0:  # what an earlier run left on node 0's disk
    open(os.path.join(cache, "vocab.txt"), "w").write("a\nb\nc\n")


def setup():
    path = os.path.join(cache, "vocab.txt")
    if os.path.exists(path):
        size = torch.tensor([float(len(open(path).read().split()))])
        dist.broadcast(size, src=0)  # expect: tie_a
        return int(size.item())
    sizes = [torch.zeros(1) for _ in range(world)]
    dist.all_gather(sizes, torch.tensor([3.0]))  # expect: tie_b
    return int(max(s.item() for s in sizes))


vocab = setup()
for _step in range(3):
    dist.all_reduce(torch.ones(vocab))
dist.barrier()
