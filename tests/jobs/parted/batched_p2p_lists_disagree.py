"""Batched p2p lists that disagree in size between two pipeline stages.

A chain of stages (stage i = rank i) passes one activation per microbatch forward, each
stage posting all its receives, then all its sends, as one batch_isend_irecv. Every stage
takes the number of microbatches from the config (4), except the last one, which counts
its own local batch (3, the shard is uneven). The stage before it sends 4 and waits for
the fourth send forever; the last stage goes on to the loss all_reduce, where the stages
that are fine join it. 2 or 4 ranks: with 4, the rank stuck (2) is not the one at fault
(3), and a majority rule names the wrong one. Modelled on pipeline hangs where stages
disagree on the number of microbatches.
"""
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _common import compute, init  # noqa: E402

rank, world = init()
MICROBATCHES, MICROBATCH_SIZE = 4, 4  # the config: 16 samples per step
last = rank == world - 1
dist.barrier()  # everyone is up


def microbatches():
    if last:  # the bug: counted from this shard (12 samples, 4 per microbatch)
        local_batch = list(range(12))
        return len(local_batch) // MICROBATCH_SIZE
    return MICROBATCHES


for _step in range(2):
    n = microbatches()
    bufs = [torch.zeros(128) for _ in range(n)]
    ops = []
    if rank > 0:
        ops += [dist.P2POp(dist.irecv, b, rank - 1) for b in bufs]
    if not last:
        ops += [dist.P2POp(dist.isend, torch.full((128,), float(i)), rank + 1) for i in range(n)]
    works = dist.batch_isend_irecv(ops)  # expect: parted
    for w in works:
        w.wait()  # expect: other
    compute()
    loss = torch.tensor([float(sum(b.sum() for b in bufs))])
    dist.all_reduce(loss)  # expect: went_on
dist.barrier()
