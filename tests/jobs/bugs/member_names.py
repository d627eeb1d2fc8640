"""Groups named by their members (`new_group(..., use_local_synchronization=True)`): only the
members call new_group, and torch salts the name with a count the rank keeps (2.13: the
groups it is a member of; 2.15: the groups it has created), so members that made different
numbers of groups before name one group differently and wait on different store keys.
Usage: member_names.py MODE (4 ranks)

Every mode first makes what looks like it and is right: subgroups by new_subgroups, then a
member-named group per pair across them; a ring of member-named pairs made in orders that
differ between non-members; many member-named groups of one pair; a collective on each.
  healthy  only that
  diverge  then ranks 0 and 1 create their pair once more (inside `if rank < 2`), and
           [0, 2], [1, 3] again: rank 0 names [0, 2] after one group more than rank 2 does
  skip     then, rightly, member-named groups whose members reach them at different times
           (one after 6 s of work, while a rank waits for a member inside new_group); then
           rank 0 alone creates [0, 2] (inside `if rank == 0`): it waits inside new_group for
           rank 2, a member, which never calls it and went on to all_reduce
  plain    then ranks 0 and 1 make [0, 1] by its members (inside `if rank < 2`), then every
           rank calls a plain new_group([0, 1, 2, 3]): torch 2.15 names it by a counter that
           the member-named group advanced on ranks 0, 1 only ("n+1" there, "n" on 2, 3), so
           it hangs; torch 2.13 and 2.4 count only plain groups there: healthy
  nonmember  then ranks 0 and 1 make [0, 1] by its members, then every rank calls a plain
           new_group([2, 3]) and its members use it: torch 2.15 names it one apart on ranks
           0, 1, which are no members and never use the name: healthy on every torch
"""
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
# every rank in one subgroup of two: each is in as many groups as the others
mine, _ = dist.new_subgroups(2)  # expect: subgroups
cross = dist.new_group([0, 2] if rank % 2 == 0 else [1, 3], use_local_synchronization=True)
dist.all_reduce(t, group=cross)
# a ring of pairs, each rank in two, made in orders that differ between non-members (rank 0
# makes [0, 1] first, rank 3 makes [2, 3] first)
for ranks in {0: ([0, 1], [0, 3]), 1: ([0, 1], [1, 2]), 2: ([2, 3], [1, 2]),
              3: ([2, 3], [0, 3])}[rank]:
    g = dist.new_group(ranks, use_local_synchronization=True)  # expect: ring
    dist.all_reduce(t, group=g)
for _ in range(12):  # many groups of one pair
    g = dist.new_group([0, 1] if rank < 2 else [2, 3], use_local_synchronization=True)
    dist.all_reduce(t, group=g)
if mode == "diverge":
    if rank < 2:
        pair = dist.new_group([0, 1], use_local_synchronization=True)  # expect: extra
    ranks = [0, 2] if rank % 2 == 0 else [1, 3]
    cross = dist.new_group(ranks, use_local_synchronization=True)  # expect: diverged
    dist.all_reduce(t, group=cross)
if mode == "skip":
    # right, and it looks like the bug: [1, 3] made by rank 1 at once and by rank 3 after
    # 6 s of work (rank 0 waits for rank 1 meanwhile), [0, 2] by rank 2 at once and by rank 0
    # only after that
    if rank == 3:  # a member slow to reach [1, 3]: busy, past the stall bound
        end = time.monotonic() + 6
        while time.monotonic() < end:
            torch.mm(torch.ones(64, 64), torch.ones(64, 64))
    if rank % 2 == 1:
        cross = dist.new_group([1, 3], use_local_synchronization=True)  # expect: late
        dist.all_reduce(t, group=cross)
    if rank < 2:
        dist.all_reduce(t, group=mine)
    cross = dist.new_group([0, 2] if rank % 2 == 0 else [1, 3], use_local_synchronization=True)
    dist.all_reduce(t, group=cross)
    # the bug: rank 0 alone makes [0, 2] again; rank 2, a member, went on to all_reduce
    if rank == 0:
        cross = dist.new_group([0, 2], use_local_synchronization=True)  # expect: skipped
    dist.all_reduce(t)  # expect: went_on
if mode == "plain":
    if rank < 2:
        pair = dist.new_group([0, 1], use_local_synchronization=True)  # expect: local
        dist.all_reduce(t, group=pair)
    every = dist.new_group([0, 1, 2, 3])  # expect: plain
    dist.all_reduce(t, group=every)
if mode == "nonmember":
    if rank < 2:
        pair = dist.new_group([0, 1], use_local_synchronization=True)
        dist.all_reduce(t, group=pair)
    other = dist.new_group([2, 3])  # expect: nonmember
    if rank >= 2:
        dist.all_reduce(t, group=other)
dist.barrier()
dist.destroy_process_group()
