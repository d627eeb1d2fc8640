"""No spans, no optimizer, no DataLoader: one all-reduce per iteration, and rank 2 logs
for ~40 ms before each. Unmodified script."""

import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
x = torch.ones(1000)


def log_metrics(step):
    time.sleep(0.04)  # expect: slow_line


for step in range(60):
    if rank == 2:
        log_metrics(step)
    dist.all_reduce(x)
dist.destroy_process_group()
