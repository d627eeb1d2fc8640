"""Two ranks doing the same work, each on a core of its own; on rank 1's core another
process spins (a noisy neighbour). Rank 1 is late not because it works more but because
it waits for its CPU. Unmodified script: an all-reduce loop with no spans."""

import os
import subprocess
import sys

import torch
import torch.distributed as dist

SPIN = """
import os, sys
os.sched_setaffinity(0, {int(sys.argv[1])})
parent = os.getppid()
while os.getppid() == parent:  # ends with the rank
    for _ in range(200000):
        pass
"""

dist.init_process_group("gloo")
rank = dist.get_rank()
cores = sorted(os.sched_getaffinity(0))
core = cores[rank % len(cores)]
os.sched_setaffinity(0, {core})
torch.set_num_threads(1)
spinners = []
if rank == 1:  # two: the rank gets a third of its core
    spinners = [subprocess.Popen([sys.executable, "-c", SPIN, str(core)]) for _ in range(2)]
a = torch.randn(160, 160)


def work(x):
    for _ in range(40):
        x = torch.tanh(x @ a)  # expect: slow_line
    return x


x = torch.randn(160, 160)
for _ in range(60):
    x = work(x)
    dist.all_reduce(x)
    x /= dist.get_world_size()
for spinner in spinners:
    spinner.kill()
    spinner.wait()
dist.destroy_process_group()
