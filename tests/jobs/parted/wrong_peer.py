"""A pipeline send to the wrong peer.

Four stages, stage i = rank i, each receiving its activation from stage i-1 and sending to
stage i+1. Stage 0 computes its next stage from a stale layout (two ranks per pipeline,
next = rank + world // 2) and sends to rank 2, which waits for rank 1. Rank 1 waits to
receive from rank 0, rank 2 from rank 1, rank 3 from rank 2: every rank is stuck, and only
rank 0 is at fault (its send). 4 ranks (with 2, the stale layout is right).
"""
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _common import compute, init  # noqa: E402

rank, world = init()
dist.barrier()  # everyone is up


def next_stage(r):
    return r + world // 2 if r == 0 else r + 1  # the bug: stage 0 uses the old layout


act = torch.ones(64)
for _step in range(2):
    if rank > 0:
        dist.recv(act, src=rank - 1)  # expect: other
    compute()
    if rank < world - 1:
        dist.send(act * 2, dst=next_stage(rank))  # expect: parted
    dist.barrier()
