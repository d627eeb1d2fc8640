"""Ranks that leave through os._exit after their last collective, as jobs do to skip a
teardown that can hang or abort. ARGV[1]: rank 1's status (the others pass 0)."""

import os
import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
for _ in range(3):
    dist.all_reduce(torch.ones(4))
dist.barrier()
sys.stdout.flush()
if dist.get_rank() == 1:
    time.sleep(0.5)  # the others are gone first: torchrun stops no one on our account
    os._exit(int(sys.argv[1]))  # expect: exit
os._exit(0)
