"""Healthy look-alike: rank 0 broadcasts from one line, the others receive from another
line (a rank-0 branch), then all line up again at the same all_reduce. The ranks issue
one op from two lines and are back in step right after: they did not part. No error or
warning finding is expected. 2 or 4 ranks."""
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _common import compute, grads, init  # noqa: E402

rank, world = init()


def publish_lr(step):
    lr = torch.tensor([0.1 / (1 + step)])
    dist.broadcast(lr, src=0)
    return lr


def receive_lr():
    lr = torch.zeros(1)
    dist.broadcast(lr, src=0)
    return lr


for step in range(6):
    compute()
    if rank == 0:
        lr = publish_lr(step)
    else:
        lr = receive_lr()
    g = grads() * lr
    dist.all_reduce(g)
dist.barrier()
dist.destroy_process_group()
