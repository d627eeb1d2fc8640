"""A hung job that is hard to watch (tests/security/test_launch_hostile.py).

usage: stuck.py PID_DIR MODE. Both ranks all_reduce once and write PID_DIR/rank-PID;
then rank 1 never joins the next all_reduce (it sleeps), and rank 0 waits in it: a hang
whose culprit is rank 1. MODE, what rank 0 does meanwhile:

  spam       prints stderr lines as fast as it can, from a thread
  warns      prints one line the log scanner reports (a finding before the hang's)

Every rank gives up by itself after 300 s (a leak stays bounded).
"""

import os
import sys
import threading
import time

import torch
import torch.distributed as dist

pid_dir, mode = sys.argv[1], sys.argv[2]
dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(1)
dist.all_reduce(t)
open(os.path.join(pid_dir, f"rank-{os.getpid()}"), "w").close()
if rank == 1:
    time.sleep(300)
    sys.exit(0)
if mode == "spam":
    def spam():
        n = 0
        while True:
            n += 1
            sys.stderr.write(f"warning: waiting, line {n}\n")

    threading.Thread(target=spam, daemon=True).start()
else:
    print("NCCL WARN Net : Connection closed by remote peer", file=sys.stderr, flush=True)
dist.all_reduce(t)
