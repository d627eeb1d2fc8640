"""Two ranks doing the same work, each pinned to a core of its own (rank R to the R-th
core it may use), and rank 0 alone evaluating every EVAL_EVERY steps (as nanoGPT's
train.py does: the other rank waits for it at the next all-reduce, by design). Healthy:
no straggler. The tests may spin other processes on rank 0's core: it is then late
because it waits for its CPU, beside its periodic evaluation. Unmodified script: an
all-reduce loop with no spans."""

import os

import torch
import torch.distributed as dist

EVAL_EVERY, STEPS = 10, 120

dist.init_process_group("gloo")
rank = dist.get_rank()
cores = sorted(os.sched_getaffinity(0))
os.sched_setaffinity(0, {cores[rank % len(cores)]})
torch.set_num_threads(1)
a = torch.randn(160, 160)


def work(x):
    for _ in range(120):
        x = torch.tanh(x @ a)
    return x


def evaluate(x):
    for _ in range(4):
        x = work(x)
    return x.norm().item()


x = torch.randn(160, 160)
for step in range(STEPS):
    if rank == 0 and step % EVAL_EVERY == 0:
        evaluate(x)
    x = work(x)
    dist.all_reduce(x)
    x /= dist.get_world_size()
dist.destroy_process_group()
