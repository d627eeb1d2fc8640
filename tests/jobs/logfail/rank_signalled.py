"""A gloo job (torchrun, 3 ranks) whose rank 1 is sent a signal from outside at step 3
(`term`: SIGTERM, as a scheduler's preemption or a user's kill; `segv`: SIGSEGV, with
faulthandler on); the others lose it in their next all_reduce.

    torchrun --nproc-per-node 3 tests/jobs/logfail/rank_signalled.py term|segv
"""

import datetime
import faulthandler
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

faulthandler.enable()
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=20))
rank = dist.get_rank()
for step in range(1, 6):
    if rank == 1 and step == 3:
        os.kill(os.getpid(), signal.SIGTERM if sys.argv[1] == "term" else signal.SIGSEGV)
        time.sleep(5)
    t = torch.ones(2)
    dist.all_reduce(t)
    print(f"step {step} loss {1 / step:.3f}", flush=True)
