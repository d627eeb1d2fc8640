"""Rank 1 enters an all_reduce and is SIGKILLed inside it; rank 0 never joins.

Rank 0 waits for the kill (a file rank 1 leaves behind) and then exits on its own.
"""

import os
import signal
import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
flag = os.path.join(sys.argv[1], "rank1-entered")
dist.all_reduce(torch.ones(2))  # expect: completed
if rank == 1:
    work = dist.all_reduce(torch.ones(123), async_op=True)  # expect: in_flight
    open(flag, "w").close()
    os.kill(os.getpid(), signal.SIGKILL)
else:
    while not os.path.exists(flag):
        time.sleep(0.05)
    time.sleep(0.5)
    os._exit(0)  # skip the group teardown that would wait for the dead rank
