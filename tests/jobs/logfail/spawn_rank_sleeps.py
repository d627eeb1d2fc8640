"""torch.multiprocessing.spawn, 3 gloo processes (timeout 5 s): process 1 sleeps 30 s at
step 3 while the others wait for it in all_reduce; spawn reports the first process whose
Gloo timeout it sees ("-- Process 0 terminated with the following error:"), a waiter.

    python tests/jobs/logfail/spawn_rank_sleeps.py PORT
"""

import datetime
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def work(rank: int, world: int, port: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=5))
    for step in range(1, 6):
        if rank == 1 and step == 3:
            time.sleep(30)
        t = torch.ones(2)
        dist.all_reduce(t)
        print(f"[rank {rank}] step {step} loss {1 / step:.3f}", flush=True)


if __name__ == "__main__":
    mp.spawn(work, args=(3, sys.argv[1]), nprocs=3)
