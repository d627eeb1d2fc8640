"""Shared start-up for the parted-ways corpus (issue 33): a gloo group with a long timeout
and a tiny stand-in for a training step's work.

The gloo timeout is 120 s so that distdoctor, not gloo, is what notices the problem. The
comparison (benchmarks/parted_comparison.py) runs the jobs bare as well, and there it sets
PARTED_GLOO_TIMEOUT lower, so that torch's own error shows within its time limit.
"""

import datetime
import os
import time

import torch
import torch.distributed as dist


def init():
    seconds = float(os.environ.get("PARTED_GLOO_TIMEOUT", "120"))
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=seconds))
    return dist.get_rank(), dist.get_world_size()


def grads(n=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, generator=g)


def compute(seconds=0.02):
    """The forward/backward of a step: time that passes without a collective."""
    time.sleep(seconds)


def scratch_dir(name):
    """A directory private to this run (keyed by the rendezvous port, so that two runs of
    the same job at once do not share it), standing in for a node's local disk."""
    port = os.environ.get("MASTER_PORT", "0")
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"parted-{name}-{port}")
    os.makedirs(path, exist_ok=True)
    return path
