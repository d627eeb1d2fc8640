"""Healthy look-alike of stray_barrier_helper: the helper that barriers is called on every
rank (only rank 0 writes inside it). No error or warning finding is expected."""
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _common import compute, grads, init, scratch_dir  # noqa: E402

rank, world = init()
out = scratch_dir("healthy-helper")


def ensure_on_disk(path, tensor):
    if dist.get_rank() == 0:
        torch.save(tensor, path)
    dist.barrier()


for step in range(6):
    compute()
    g = grads()
    dist.all_reduce(g)
    if step == 2:
        ensure_on_disk(os.path.join(out, f"snapshot-{step}.pt"), g)
    dist.barrier()
dist.destroy_process_group()
