"""Ranks held inside group creation by what other ranks did. Usage: creation_waits.py MODE

  guarded  (4 ranks) only the pair creates its plain group (`if rank in tp_ranks`), then
           every rank all_reduces. torch's rule is that every rank calls new_group(), yet
           without TORCH_DIST_INIT_BARRIER=1 this works (ranks 2, 3 never use the name);
           with it, new_group ends in a store barrier over every rank keyed by the group's
           name, which ranks 2, 3 never write: ranks 0, 1 hang there, 2, 3 in all_reduce
  ring     (4 ranks) a ring of pairs made by their members (use_local_synchronization=True),
           each rank in an order of its own: rank 0 makes [0, 1] first, rank 1 [1, 2], rank 2
           [2, 3], rank 3 [0, 3]: each waits inside new_group for a member that is making
           another group, around the ring
  healthy  (4 ranks) what looks like them and works: the same ring of pairs in orders that
           differ only between non-members; rank 2 computes for BUSY_S seconds (default 11)
           before a plain new_group every rank calls, and ranks 0, 1, 3 wait inside it
           meanwhile (a long wait, not an error); `guarded` without the barrier, last (a
           plain group made after it would be named apart: another bug)
"""
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _common import init  # noqa: E402

rank, world = init()
mode = sys.argv[1]
t = torch.ones(4)
dist.all_reduce(t)
if mode in ("ring", "healthy"):
    orders = {0: [[0, 1], [0, 3]], 1: [[0, 1], [1, 2]], 2: [[2, 3], [1, 2]],
              3: [[2, 3], [0, 3]]}  # each pair's members make it at the same point
    if mode == "ring":
        orders = {0: [[0, 1], [0, 3]], 1: [[1, 2], [0, 1]], 2: [[2, 3], [1, 2]],
                  3: [[0, 3], [2, 3]]}
    for p in orders[rank]:
        g = dist.new_group(p, use_local_synchronization=True)  # expect: ring
        dist.all_reduce(t, group=g)
if mode == "healthy":
    if rank == 2:
        end = time.monotonic() + float(os.environ.get("BUSY_S", "11"))
        while time.monotonic() < end:
            torch.mm(torch.ones(64, 64), torch.ones(64, 64))  # expect: busy
    g = dist.new_group([0, 1, 2, 3])  # expect: waited
    dist.all_reduce(t, group=g)
if mode in ("guarded", "healthy"):
    tp_ranks = [0, 1]
    if rank in tp_ranks:
        tp = dist.new_group(tp_ranks)  # expect: guarded
        dist.all_reduce(t, group=tp)
    dist.all_reduce(t)  # expect: after
dist.barrier()
dist.destroy_process_group()
