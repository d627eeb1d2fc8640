"""A steady job for distdoctor's own processes to die beside (tests/test_chaos_sigkill.py):
all_reduces on gloo, CHAOS_SLEEP_MS apart, CHAOS_OPS of them, or fewer when CHAOS_STOP
names a file: the job stops once rank 0 sees it (the ranks agree through the all_reduce
itself), then a barrier. Each rank prints how many all_reduces it did and the sum it
reduced (sum over i of (i + 0) + (i + 1): the count squared), with or without
distdoctor."""

import os
import time

import torch
import torch.distributed as dist

N = int(os.environ.get("CHAOS_OPS", "400"))
SLEEP_S = float(os.environ.get("CHAOS_SLEEP_MS", "10")) / 1000
STOP = os.environ.get("CHAOS_STOP")

dist.init_process_group("gloo")
rank = dist.get_rank()
total, done = 0.0, 0
for i in range(N):
    stop = 1.0 if rank == 0 and STOP and os.path.exists(STOP) else 0.0
    t = torch.tensor([float(i + rank), stop])
    dist.all_reduce(t)
    if t[1] > 0:
        break
    total += float(t[0])
    done += 1
    if SLEEP_S:
        time.sleep(SLEEP_S)
dist.barrier()
print(f"rank {rank} done: {done} all_reduces, sum {total:g}\n", end="", flush=True)
dist.destroy_process_group()
