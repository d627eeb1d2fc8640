"""Rank 1 runs a function of its own for ~16 ms before each all-reduce: a straggler whose
cause is one line its peers never run. Run with DISTDOCTOR_SAMPLE_HZ=25 (a look every
40 ms, as a sampler starved of CPU on a loaded node gets), that line gets ~0.4 samples a
step: under the half a sample a step that a line every rank runs needs to be told from
noise, and still ~40 samples over the window where its peers have none."""

import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
x = torch.ones(1000)


def own_extra_work():
    time.sleep(0.016)  # expect: slow_line


for _ in range(120):
    if rank == 1:
        own_extra_work()
    dist.all_reduce(x)
dist.destroy_process_group()
