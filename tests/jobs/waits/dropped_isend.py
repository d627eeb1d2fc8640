"""A pipeline stage sends its activations with dist.isend and drops the request without
wait(): the message can be lost (torch 2.13's gloo frees the send with its request: a
race, so the pattern repeats), the next stage then waits in recv forever, and the sender
waits for the gradient that never comes. The culprit is the isend, at its line."""
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bugs"))
from _common import init  # noqa: E402

rank, world = init()
act = torch.randn(1024)
grad = torch.zeros(1024)
dist.all_reduce(torch.ones(1))
for _micro in range(20):
    if rank == 0:
        dist.isend(act * 2, dst=1)  # expect: culprit
        dist.recv(grad, src=1)
    else:
        dist.recv(act, src=0)  # expect: others
        dist.send(act * 2, dst=0)
print(f"rank {rank} done", flush=True)
