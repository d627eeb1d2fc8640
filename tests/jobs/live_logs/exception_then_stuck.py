"""Rank 1 prints the exception that ends its training (traceback.print_exc, then
sys.exit(1)), but a non-daemon thread it started keeps the process alive: the
interpreter waits for that thread before its exit hooks, so the rank runs on, stuck,
and rank 0 waits for it in a collective until distdoctor stops the job
(--on-hang kill). ARGV[1]: how long the thread keeps rank 1 alive, in seconds."""

import sys
import threading
import time
import traceback

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
x = torch.ones(4)
dist.all_reduce(x)
if rank == 1:
    threading.Thread(target=time.sleep, args=(float(sys.argv[1]),)).start()
    try:
        raise RuntimeError("loss is nan at step 1")  # expect: raise
    except RuntimeError:
        traceback.print_exc()
        sys.exit(1)
dist.all_reduce(x)
dist.destroy_process_group()
