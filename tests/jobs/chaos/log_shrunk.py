"""A clean-up process shrinks each rank's event log mid-job (`truncate -s 0` for rank 0,
to half its size for rank 1), and the ranks go on with their collectives: a store into
the shrunk file's map was SIGBUS, which killed the rank (and the job with it)."""

import os
import subprocess

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
path = os.path.join(os.environ["DISTDOCTOR_RUN_DIR"], "ranks", f"rank-{rank:05d}.ring")
total = 0.0
for i in range(300):
    if i == 100:
        size = 0 if rank == 0 else os.stat(path).st_size // 2
        subprocess.run(["truncate", "-s", str(size), path], check=True)
    t = torch.ones(2)
    dist.all_reduce(t)
    total += float(t.sum())
dist.barrier()
print(f"rank {rank} done: {total}", flush=True)
