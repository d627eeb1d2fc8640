"""A helper that makes sure "every rank sees the file" with a barrier, called on rank 0 only.

Modelled on `if trainer.is_global_zero: trainer.save_checkpoint(...)` (save_checkpoint
barriers inside) and on rank-0-only metric/logging helpers that synchronise. Rank 0's
stray barrier pairs with the others' end-of-step barrier (barriers are alike), so the
first op that disagrees comes one op later: rank 0's own end-of-step barrier against the
others' next all_reduce, at lines with nothing wrong with them. Where the ranks parted is
the barrier inside ensure_on_disk(), called from the rank-0 branch. 2 or 4 ranks.
"""
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _common import compute, grads, init, scratch_dir  # noqa: E402

rank, world = init()
out = scratch_dir("stray-barrier")


def ensure_on_disk(path, tensor):
    torch.save(tensor, path)
    dist.barrier()  # expect: parted


for step in range(6):
    compute()
    g = grads()
    dist.all_reduce(g)
    if rank == 0 and step == 2:  # only the main process writes the snapshot
        ensure_on_disk(os.path.join(out, f"snapshot-{step}.pt"), g)  # expect: caller
    dist.barrier()  # expect: other
