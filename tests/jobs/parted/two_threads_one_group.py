"""Two threads of one rank issue collectives on the same (default) process group.

A metrics-reporting thread, woken by the training loop every few steps, all-reduces the
step's loss statistics for logging while the main thread goes on training (all_reduce of
the gradients). On rank 0 the reporter first formats and writes the log line (the
"logger" is slower there), so its all_reduce is issued after the main thread's next one;
on the other ranks it is issued before. The order of collectives across two threads is
not defined, so the ranks' sequences on the group differ: a size mismatch (4 floats
against 64), or a deadlock. Modelled on async-checkpoint and logging threads that share
the training group.

Every rank is at fault in the same way (it uses one group from two threads); the lines
are the reporter's all_reduce and the training step's all_reduce.
"""
import queue
import sys
import threading
import time

import torch
import torch.distributed as dist

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _common import compute, grads, init  # noqa: E402

rank, world = init()
jobs: "queue.Queue[int | None]" = queue.Queue()


def report_metrics():
    while (step := jobs.get()) is not None:
        if rank == 0:
            time.sleep(0.15)  # rank 0 writes the line to its logger first
        stats = torch.tensor([float(step), 1.0, 2.0, 3.0])
        dist.all_reduce(stats)  # expect: parted


reporter = threading.Thread(target=report_metrics, name="metrics-reporter", daemon=True)
reporter.start()

for step in range(12):
    compute(0.05)
    g = grads()
    dist.all_reduce(g)  # expect: other
    if step % 4 == 3:
        jobs.put(step)
jobs.put(None)
reporter.join()
dist.barrier()
