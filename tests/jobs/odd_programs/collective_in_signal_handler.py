"""A rank whose signal handler issues a collective (as a preemption handler's barrier or
checkpoint does), fired by a 1 ms timer while the rank issues OPS all_reduces of shapes
the log has not seen yet. The handler's all_reduce is on a group of the rank alone, so
the ranks need not agree on how many the timer fired. Each rank prints its totals."""

import signal
import sys

import torch
import torch.distributed as dist

OPS = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
alone = [dist.new_group([r]) for r in range(world)][rank]
fired = 0


def on_timer(signum, frame):
    global fired
    fired += 1
    dist.all_reduce(torch.ones(1 + fired % 4000, 3), group=alone)


signal.signal(signal.SIGALRM, on_timer)
signal.setitimer(signal.ITIMER_REAL, 0.001, 0.001)
total = 0.0
for i in range(OPS):
    t = torch.ones(1 + i % 5000, 2)
    dist.all_reduce(t)
    total += t[0, 0].item()
signal.setitimer(signal.ITIMER_REAL, 0)
dist.barrier()
print(f"rank {rank}: {OPS} all_reduces, sum of firsts {total:g}, the handler's "
      f"{'some' if fired else 'none'}", flush=True)
dist.destroy_process_group()
