"""A rank that skips the rest of a step when its loss is not finite.

Each step all-reduces the gradients, then all-gathers the number of frames the ranks saw
(the step's logging). At step 3 rank 1's loss comes out NaN; its loop checks that after
the gradients' all-reduce and `continue`s, so it leaves out the frame count and goes on to
step 4's gradient all-reduce, which is paired with rank 0's all-gather of step 3. With 2
ranks there is no majority, and the order of the lines misleads: rank 0 is at the later
line of the loop's body, yet rank 1 is the one an iteration ahead. The evidence is the
job's rhythm: every step before issued the all-gather after the gradients' all-reduce.
Modelled on a HuBERT pre-training loop that returned early on a NaN loss before the
all-gather of the frame count.
"""
import math
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _common import compute, grads, init  # noqa: E402

rank, world = init()


def loss_of(step):
    compute()
    return math.nan if (rank == 1 and step == 3) else 1.0 / (step + 1)


for step in range(6):
    loss = loss_of(step)
    g = grads(seed=step)
    dist.all_reduce(g)  # expect: parted
    if not math.isfinite(loss):
        continue  # skip the logging of a bad step: on this rank only
    frames = [torch.zeros(2) for _ in range(world)]
    dist.all_gather(frames, torch.tensor([float(step), 8.0]))  # expect: other
dist.barrier()
dist.destroy_process_group()
