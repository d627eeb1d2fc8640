"""Healthy look-alike: pipeline stages issue the same collectives from different lines
every step. The first stage sends activations and all-reduces its loss share in
first_stage(); middle stages receive and send in middle_stage(); the last stage receives
and all-reduces the loss in last_stage(); every stage then all-reduces its gradients from
its own function. Same ops, same order, different lines on each rank. No error or warning
finding is expected. 2 or 4 ranks."""
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _common import compute, grads, init  # noqa: E402

rank, world = init()


def first_stage(step):
    compute()
    dist.send(torch.full((128,), float(step)), dst=rank + 1)
    loss = torch.zeros(1)
    dist.all_reduce(loss)
    dist.all_reduce(grads(32))


def middle_stage(step):
    act = torch.zeros(128)
    dist.recv(act, src=rank - 1)
    compute()
    dist.send(act + 1, dst=rank + 1)
    loss = torch.zeros(1)
    dist.all_reduce(loss)
    dist.all_reduce(grads(32))


def last_stage(step):
    act = torch.zeros(128)
    dist.recv(act, src=rank - 1)
    compute()
    loss = act.mean().reshape(1)
    dist.all_reduce(loss)
    dist.all_reduce(grads(32))


stage = first_stage if rank == 0 else last_stage if rank == world - 1 else middle_stage
for step in range(6):
    stage(step)
dist.barrier()
dist.destroy_process_group()
