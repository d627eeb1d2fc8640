"""Healthy look-alike of two_threads_one_group: the metrics thread has a group of its own
(created on every rank, in the same order, before the thread starts), so its collectives
never share a group with the training step's. No error or warning finding is expected."""
import queue
import sys
import threading
import time

import torch
import torch.distributed as dist

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _common import compute, grads, init  # noqa: E402

rank, world = init()
metrics_group = dist.new_group(backend="gloo")
jobs: "queue.Queue[int | None]" = queue.Queue()


def report_metrics():
    while (step := jobs.get()) is not None:
        if rank == 0:
            time.sleep(0.15)
        stats = torch.tensor([float(step), 1.0, 2.0, 3.0])
        dist.all_reduce(stats, group=metrics_group)


reporter = threading.Thread(target=report_metrics, name="metrics-reporter", daemon=True)
reporter.start()

for step in range(12):
    compute(0.05)
    g = grads()
    dist.all_reduce(g)
    if step % 4 == 3:
        jobs.put(step)
jobs.put(None)
reporter.join()
dist.barrier()
dist.destroy_process_group()
