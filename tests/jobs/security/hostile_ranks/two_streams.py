"""Rank 0 prints 4 MiB to stdout (its reader is not reading: it fills and waits); rank 1
logs to stderr meanwhile, then both meet at a barrier and exit. Bare, stderr goes on
whatever stdout's reader does (tests/security/test_launch_hostile.py).

usage: two_streams.py
"""

import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
dist.all_reduce(torch.ones(1))
if rank == 0:
    line = b"x" * 1023 + b"\n"
    for _ in range(4096):
        sys.stdout.buffer.write(line)
    sys.stdout.flush()
else:
    time.sleep(1)  # rank 0's stdout is full by now
    for i in range(20):
        print(f"rank 1 log line {i}", file=sys.stderr, flush=True)
    print("RANK 1 LOGGED", file=sys.stderr, flush=True)
dist.barrier()
dist.destroy_process_group()
