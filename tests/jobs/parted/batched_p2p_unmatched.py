"""A batch_isend_irecv whose receive has no matching send on the peer.

Rank 0 exchanges with rank 1 in one batch: it sends its activations and receives rank 1's
gradients. Rank 1's list only receives (the send of its gradients was left out of the
batch when the schedule was edited), then it goes on to the end-of-step barrier. Rank 0
waits to receive from rank 1 at its batch_isend_irecv line; rank 1 posted no matching
send and waits in the barrier. Modelled on pipeline schedules whose batched p2p lists
were built differently on the two sides. 2 ranks.
"""
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _common import compute, grads, init  # noqa: E402

rank, world = init()
act, grad_in = torch.ones(256), torch.zeros(256)
dist.all_reduce(grads())  # everyone is up

for step in range(3):
    compute()
    if rank == 0:
        ops = [dist.P2POp(dist.isend, act, 1), dist.P2POp(dist.irecv, grad_in, 1)]
        for w in dist.batch_isend_irecv(ops):  # expect: other
            w.wait()
    else:
        recv_act = torch.zeros(256)
        ops = [dist.P2POp(dist.irecv, recv_act, 0)]
        if step == 0:  # the first step's warm-up, written before the backward existed
            ops.append(dist.P2POp(dist.isend, grads(256), 0))
        for w in dist.batch_isend_irecv(ops):  # expect: parted
            w.wait()
    dist.barrier()  # expect: went_on
