"""Resuming from a checkpoint that is on one node's local disk only.

load() looks in the node-local checkpoint directory; where it finds a checkpoint it
reads it and broadcasts the step from rank 0, so every rank resumes at the same step.
Node 1's directory is empty (the last run saved on node 0's disk only), so its rank(s)
skip the branch with the broadcast and go straight to the training step's all_reduce.
With 2 ranks, one rank per node: no majority; the evidence is that rank 1 is already
in step 0's gradient all_reduce in train_step while rank 0 is still in load(). With 4
ranks, two per node: an even split, ranks 2 and 3 skipped. Modelled on resume code that
checks `os.path.exists` on every rank.
"""
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _common import compute, grads, init, scratch_dir  # noqa: E402

rank, world = init()
per_node = 1 if world <= 2 else 2
node = rank // per_node
ckpt_dir = os.path.join(scratch_dir("resume"), f"node{node}")
os.makedirs(ckpt_dir, exist_ok=True)
if node == 0 and rank % per_node == 0:  # what the last run left: node 0's disk only
    torch.save({"step": 5}, os.path.join(ckpt_dir, "last.pt"))
dist.barrier()  # the launcher's rendezvous, as it were: everyone is up


def load(directory):
    path = os.path.join(directory, "last.pt")
    step = torch.zeros(1)
    if os.path.exists(path):  # node-local: false on node 1
        if dist.get_rank() == 0:
            step[0] = torch.load(path)["step"]
        dist.broadcast(step, src=0)  # expect: other
    return int(step.item())


def train_step(step):
    compute()
    g = grads()
    dist.all_reduce(g)  # expect: parted
    return g


start = load(ckpt_dir)
for step in range(start, start + 4):
    train_step(step)
dist.barrier()
