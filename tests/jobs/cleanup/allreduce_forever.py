"""Ranks that all-reduce until they are stopped (a job to kill in its middle).

usage: allreduce_forever.py PID_DIR. Once its first all_reduce is done, each rank writes
an empty file PID_DIR/rank-PID. Gives up by itself after 300 s (a leak stays bounded).
"""

import os
import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
open(os.path.join(sys.argv[1], f"rank-{os.getpid()}"), "w").close()
deadline = time.monotonic() + 300
while time.monotonic() < deadline:
    dist.all_reduce(t)
    time.sleep(0.01)
