"""A process that makes its default group again and again (a test suite's fixture, a
sweep in one process, a notebook), each time at a fresh file store, with a synchronous
and an asynchronous op. Each rank prints its open descriptors and threads after the
first FIRST groups and after all ROUNDS: a job's own count does not grow with them."""

import os
import sys
import time

import torch
import torch.distributed as dist

FIRST, ROUNDS = 5, int(sys.argv[1]) if len(sys.argv) > 1 else 30
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
stores = os.path.join(os.environ["DISTDOCTOR_RUN_DIR"], "stores")
os.makedirs(stores, exist_ok=True)


def held() -> str:
    """The fewest descriptors and threads over a second: a thread of the group just
    destroyed may still be on its way out on a loaded machine (CI saw 6 for 5 once); what
    the process keeps is there at every look."""
    fds, threads = [], []
    for _ in range(10):
        fds.append(len(os.listdir("/proc/self/fd")))
        threads.append(len(os.listdir("/proc/self/task")))
        time.sleep(0.1)
    return f"{min(fds)} descriptors, {min(threads)} threads"


for round_ in range(ROUNDS):
    dist.init_process_group("gloo", init_method=f"file://{stores}/round{round_}",
                            rank=rank, world_size=world)
    t = torch.ones(2)
    dist.all_reduce(t)
    dist.all_reduce(t, async_op=True).wait()
    dist.barrier()
    dist.destroy_process_group()
    if round_ + 1 in (FIRST, ROUNDS):
        print(f"rank {rank} after {round_ + 1} groups: {held()}", flush=True)
