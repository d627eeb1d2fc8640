"""One rank spins forever in its data loader; the others wait for it in an all_reduce."""
import sys
import time

import torch.distributed as dist

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _common import grads, init  # noqa: E402

rank, world = init()


def wait_for_shard_on_nfs():
    while True:  # the bug: a retry loop with no deadline
        time.sleep(0.01)  # expect: stuck


for step in range(6):
    if rank == 3 and step == 2:
        wait_for_shard_on_nfs()
    dist.all_reduce(grads())  # expect: others
