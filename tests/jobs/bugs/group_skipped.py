"""Process groups that some ranks create and others skip (a user bug: torch requires every
rank to call new_group() for every group, in the same order). Usage: group_skipped.py MODE

  members  (3 ranks) only the tensor-parallel pair creates its group; then every rank creates
           the shared one, which the pair names "2" and rank 2 names "1"
  last     (2 ranks) rank 0 alone creates a group and waits inside new_group for rank 1, which
           went on to the next collective
  local_first  (4 ranks) each pair makes its own group first, [0, 1] by its members
           (use_local_synchronization=True), [2, 3] by a plain new_group only they call;
           then every rank makes the same group, and rank 0 alone creates [0, 1] as in
           `last`. torch 2.15 numbers every creation: the shared group is "2" everywhere,
           the pair's plain names start at "2" on ranks 0, 1 and at "1" on ranks 2, 3.
           torch 2.13 numbers plain groups only: the shared group is "1" on ranks 0, 1
           and "2" on ranks 2, 3 (a name for two member lists)
"""
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _common import init  # noqa: E402

rank, world = init()
mode = sys.argv[1]
t = torch.ones(4)
dist.all_reduce(t)
if mode == "members":
    tp_ranks = [0, 1]
    if rank in tp_ranks:
        tp = dist.new_group(tp_ranks)  # expect: tp_guarded
    everyone = dist.new_group(list(range(world)))  # expect: shared
    dist.all_reduce(t, group=everyone)
elif mode == "local_first":
    mine = [0, 1] if rank < 2 else [2, 3]
    pair = dist.new_group(mine, use_local_synchronization=rank < 2)  # expect: own_pair
    dist.all_reduce(t, group=pair)
    everyone = dist.new_group(list(range(world)))  # expect: everyone
    dist.all_reduce(t, group=everyone)
    if rank == 0:
        again = dist.new_group([0, 1])  # expect: rank0_after_local
    dist.all_reduce(t)  # expect: next_after_local
else:
    if rank == 0:
        pair = dist.new_group([0, 1])  # expect: rank0_guarded
    dist.all_reduce(t)  # expect: next
dist.barrier()
dist.destroy_process_group()
