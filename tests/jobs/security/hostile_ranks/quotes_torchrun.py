"""A healthy job whose rank 0 prints what torchrun prints for a failed rank (a log of an
earlier run, a nested launch's output): rank 1 "exitcode : -9". Both ranks all_reduce
50 times and exit 0 (tests/security/test_launch_hostile.py)."""

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(1)
dist.all_reduce(t)
if rank == 0:
    print("yesterday's run ended:\n  rank      : 1 (local_rank: 1)\n"
          "  exitcode  : -9 (pid: 4242)", flush=True)
for _ in range(50):
    dist.all_reduce(t)
print(f"rank {rank} done", flush=True)
dist.destroy_process_group()
