"""Healthy: a background thread all-reduces metrics on a process group of its own (created
with new_group by every rank, in the same order, before the thread starts: the right
way), at a different cadence on each rank (every 50 ms on rank 0, 80 ms on rank 1, ...),
while the main thread trains with all_reduce on the default group (issue 48, Why 7).

The thread's all_reduce waits for the slowest rank's cadence: that wait is the thread's
own rhythm, not a step that is late. No error or warning finding is expected.

argv: [steps] [cadence ms per rank, comma-separated] [ms of each step's own wait]"""
import sys
import threading
import time

import torch
import torch.distributed as dist

STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 120
CADENCE = [float(x) for x in (sys.argv[2] if len(sys.argv) > 2 else "50,80,65,95").split(",")]

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
metrics_group = dist.new_group(backend="gloo")
stop = threading.Event()
STEP_S = float(sys.argv[3]) / 1000 if len(sys.argv) > 3 else 0.06
every = CADENCE[rank % len(CADENCE)] / 1000


def report_metrics():
    n = 0
    while True:
        # the stop flag rides along: every rank's thread leaves after the same round
        stats = torch.tensor([float(n), 1.0, 2.0, float(stop.is_set())])
        dist.all_reduce(stats, group=metrics_group)
        if stats[3] > 0:
            return
        n += 1
        time.sleep(every)


reporter = threading.Thread(target=report_metrics, name="metrics-reporter", daemon=True)
reporter.start()

model = torch.nn.Linear(256, 256)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(STEPS):
    x = torch.randn(64, 256)
    for _ in range(4):
        x = torch.tanh(model(x))  # the step's own work
    opt.zero_grad()
    x.sum().backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
    opt.step()
    time.sleep(STEP_S)  # its data loading, logging
stop.set()
reporter.join()
dist.barrier()
dist.destroy_process_group()
