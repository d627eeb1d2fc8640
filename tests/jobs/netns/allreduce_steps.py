"""Training-like steps across nodes: a little work, then an all_reduce of a few MiB (the
gradients), each step's time printed by rank 0. Runs until stopped, at most STEPS steps.

usage: allreduce_steps.py [MIB] [STEPS]
"""

import datetime
import sys
import time

import torch
import torch.distributed as dist

mib = float(sys.argv[1]) if len(sys.argv) > 1 else 2.0
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 10_000
# a long gloo timeout: distdoctor, not gloo, must be what notices a lost node
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
rank = dist.get_rank()
grads = torch.ones(int(mib * (1 << 20)) // 4)
for step in range(steps):
    time.sleep(0.02)  # the step's own work
    start = time.monotonic()
    dist.all_reduce(grads)
    if rank == 0:
        print(f"step {step} all_reduce {time.monotonic() - start:.3f} s", flush=True)
dist.destroy_process_group()
