"""Two ranks doing the same work, each pinned to a core of its own (rank R to the R-th
core it may use). The test spins other processes on rank 1's core (a noisy neighbour):
rank 1 is late not because it works more but because it waits for its CPU. Unmodified
script: an all-reduce loop with no spans."""

import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
cores = sorted(os.sched_getaffinity(0))
os.sched_setaffinity(0, {cores[rank % len(cores)]})
torch.set_num_threads(1)
a = torch.randn(160, 160)


def work(x):
    for _ in range(120):
        x = torch.tanh(x @ a)  # expect: slow_line
    return x


x = torch.randn(160, 160)
for _ in range(120):
    x = work(x)
    dist.all_reduce(x)
    x /= dist.get_world_size()
dist.destroy_process_group()
