"""Shared start-up for the bug corpus: a gloo group and a small training-like loop body."""

import datetime

import torch
import torch.distributed as dist


def init():
    # a long gloo timeout: distdoctor, not gloo, must be what notices the problem
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
    return dist.get_rank(), dist.get_world_size()


def grads(n=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, generator=g)
