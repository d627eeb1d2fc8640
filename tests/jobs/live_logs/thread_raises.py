"""A rank's helper thread that dies of an uncaught exception (Python prints "Exception in
thread ..." and its traceback, and the process goes on).

`healthy`: every rank's metrics thread raises once; the job trains on and exits 0.
`prefetch`: rank 1's prefetch thread raises before it feeds its queue; rank 1's main thread
then gives up on the queue after a while (queue.Empty) and exits 1."""

import queue
import sys
import threading
import time

import torch
import torch.distributed as dist

mode = sys.argv[1]
dist.init_process_group("gloo")
rank = dist.get_rank()
batches: queue.Queue = queue.Queue()


def metrics():
    raise ValueError("metrics endpoint refused the push")  # expect: metrics


def prefetch():
    if rank == 1:
        raise OSError("shard 7 could not be opened")  # expect: prefetch
    for _ in range(20):
        batches.put(torch.ones(4))


threading.Thread(target=metrics if mode == "healthy" else prefetch, name="worker").start()
x = torch.ones(4)
for _ in range(20):
    if mode == "prefetch":
        x = batches.get(timeout=3)
    dist.all_reduce(x)
    time.sleep(0.01)
dist.destroy_process_group()
print(f"rank {rank} done", flush=True)
