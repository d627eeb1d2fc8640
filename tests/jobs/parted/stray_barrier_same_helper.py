"""The same barrier helper is the legitimate end-of-step barrier (called from the loop on
every rank) and is also called from a rank-0-only branch (saving a checkpoint).

The innermost line of the two barriers is the same line (sync_all's barrier); only the
line that called the helper differs. Rank 0's extra barrier, called from save(), pairs
with the others' end-of-step call; the first op that disagrees is one op later. Where
the ranks parted: the rank-0-only call in save(). 2 or 4 ranks.
"""
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _common import compute, grads, init, scratch_dir  # noqa: E402

rank, world = init()
out = scratch_dir("same-helper")


def sync_all():
    """Wait until every rank got here (and so sees what was written before)."""
    dist.barrier()


def save(step, state):
    torch.save(state, os.path.join(out, f"ckpt-{step}.pt"))
    sync_all()  # expect: parted


for step in range(6):
    compute()
    g = grads()
    dist.all_reduce(g)
    if step == 3 and rank == 0:  # the bug: save() is collective, called on rank 0 alone
        save(step, {"step": step, "g": g})  # expect: caller
    sync_all()  # expect: other
