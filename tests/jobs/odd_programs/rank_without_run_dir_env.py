"""A rank whose environment lacks distdoctor's run dir (a launcher that passes variables
one by one, or a script that cleans its environment) while rank 0's has it: it is traced
into the same run dir as the others, at once. Each rank prints its sum."""

import os

import torch
import torch.distributed as dist

rank = int(os.environ["RANK"])
if rank == 1:
    os.environ.pop("DISTDOCTOR_RUN_DIR", None)
dist.init_process_group("gloo")
t = torch.ones(4)
for _ in range(3):
    dist.all_reduce(t)
print(f"rank {rank}: sum {t.sum().item():.0f}", flush=True)
dist.destroy_process_group()
