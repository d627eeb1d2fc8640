"""A healthy gloo job (torchrun, 2 ranks) whose rank 0 stops its own helper process (a
prefetcher) with SIGTERM after step 4; the helper says "Received SIGTERM" as it exits, and
training goes on to finish a few lines later.

    torchrun --nproc-per-node 2 tests/jobs/logfail/helper_sigterm_then_finish.py
"""

import datetime
import signal
import subprocess
import sys
import time

import torch
import torch.distributed as dist

HELPER = ("import signal, sys, time\n"
          "def bye(*_):\n"
          "    print('prefetcher: Received SIGTERM, exiting', flush=True); sys.exit(0)\n"
          "signal.signal(signal.SIGTERM, bye)\n"
          "print('prefetcher: started', flush=True)\n"
          "time.sleep(60)\n")

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
rank = dist.get_rank()
helper = subprocess.Popen([sys.executable, "-c", HELPER]) if rank == 0 else None
time.sleep(1)
for step in range(1, 7):
    t = torch.ones(2)
    dist.all_reduce(t)
    if rank == 0:
        print(f"step {step} | loss {1.0 / step:.4f}", flush=True)
    if helper is not None and step == 4:
        helper.send_signal(signal.SIGTERM)  # the shards are cached: no more prefetching
        helper.wait()
if rank == 0:
    print("training finished", flush=True)
dist.destroy_process_group()
