"""Both ranks end (os._exit(0)) one second after rank 0 entered an all_reduce that rank 1
never joins: too short a wait for a hang, but not a job whose collectives all completed."""

import os
import threading
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
for _ in range(3):
    dist.all_reduce(torch.ones(4))
if rank == 0:
    threading.Timer(1.0, os._exit, (0,)).start()
    dist.all_reduce(torch.ones(4))  # rank 1 never joins
else:
    time.sleep(1.5)
    os._exit(0)
