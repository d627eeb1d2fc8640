"""Healthy: a background thread all-reduces metrics on a process group of its own (created
with new_group by every rank, in the same order, before the thread starts: the right
way), at a different cadence on each rank (every 50 ms on rank 0, 80 ms on rank 1, ...),
while the main thread trains with all_reduce on the default group (issue 48, Why 7).

The thread's all_reduce waits for the slowest rank's cadence: that wait is the thread's
own rhythm, not a step that is late. No error or warning finding is expected.

Its variants (the optional argv after the first three):
- "manual": no optimizer (one flat all-reduce of the gradients, SGD by hand): no implicit
  step spans, the steps are the turns of the main thread's pattern of collectives, which
  the thread's interleave with;
- "slow=R": rank R does 40 ms of work of its own per step (a real straggler, beside the
  healthy thread);
- "nothread": the same job without the thread (to compare);
- "swap": the thread all-reduces on the default group and training runs on a group of all
  ranks of its own (each group still used by one thread only).

argv: [steps] [cadence ms per rank, comma-separated] [ms of each step's own wait]
      [manual] [slow=R] [nothread] [swap]"""
import sys
import threading
import time

import torch
import torch.distributed as dist

STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 120
CADENCE = [float(x) for x in (sys.argv[2] if len(sys.argv) > 2 else "50,80,65,95").split(",")]
FLAGS = sys.argv[4:]
SLOW = next((int(f[5:]) for f in FLAGS if f.startswith("slow=")), None)

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
own_group = dist.new_group(backend="gloo")
metrics_group, train_group = (None, own_group) if "swap" in FLAGS else (own_group, None)
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


def extra_work():
    time.sleep(0.04)  # expect: slow_line


reporter = threading.Thread(target=report_metrics, name="metrics-reporter", daemon=True)
if "nothread" not in FLAGS:
    reporter.start()

model = torch.nn.Linear(256, 256)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for _step in range(STEPS):
    x = torch.randn(64, 256)
    for _ in range(4):
        x = torch.tanh(model(x))  # the step's own work
    model.zero_grad()
    x.sum().backward()
    if rank == SLOW:
        extra_work()
    if "manual" in FLAGS:  # one flat all-reduce, the update by hand
        flat = torch.cat([p.grad.flatten() for p in model.parameters()])
        dist.all_reduce(flat, group=train_group)
        with torch.no_grad():
            params = list(model.parameters())
            for p, g in zip(params, flat.split([p.numel() for p in params]), strict=True):
                p -= 0.01 * g.view_as(p)
    else:
        for p in model.parameters():
            dist.all_reduce(p.grad, group=train_group)
        opt.step()
    time.sleep(STEP_S)  # its data loading, logging
stop.set()
if reporter.is_alive() or reporter.ident:
    reporter.join()
dist.barrier()
dist.destroy_process_group()
