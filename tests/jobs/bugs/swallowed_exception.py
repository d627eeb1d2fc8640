"""A data error on one rank is caught and the step skipped: its gradients are never reduced."""
import sys

import torch.distributed as dist

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _common import grads, init  # noqa: E402

rank, world = init()


def load_batch(step):
    if rank == 1 and step == 4:
        raise ValueError("corrupt sample")
    return grads(16, seed=step)


for step in range(10):
    try:
        g = load_batch(step)
    except ValueError:
        continue  # the bug: "skip bad batches" on one rank only
    dist.all_reduce(g)  # expect: others
dist.destroy_process_group()  # expect: culprit
