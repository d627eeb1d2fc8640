"""A hand-written pipeline (activations 0 -> 1 -> ... -> last) with blocking send/recv, where
the stages disagree on who goes first on one link (issue 48, item 4).

On every link the upstream stage sends its activations first and the downstream stage
receives first; the gradients come back after. The last stage, written apart, sends the
gradient it keeps (the previous micro-batch's, zeros at first) up before it receives:
with gloo a send blocks until its receive is posted, so the stage before it (blocked in
its send of the activations) and the last stage (blocked in its send of the gradient)
wait for each other. The last stage broke the order every other link follows.

Kinds (argv[1]):
- `last_sends_first`: the bug from the first step (3 ranks: link 0-1 shows the order);
- `after_eval`: a forward-only evaluation pass runs first (every link, the one that
  deadlocks too, shows the order in it), then training deadlocks;
- `symmetric`: every stage sends to its neighbours before it receives (one function for
  all: a halo exchange written with blocking sends). Nobody broke an order the others
  keep: a tie.
"""
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _common import compute, init  # noqa: E402

KIND = sys.argv[1] if len(sys.argv) > 1 else "last_sends_first"
N = 1 << 16  # 256 KiB per message: a send that blocks until it is received
rank, world = init()
last = world - 1


def forward_only():
    act = torch.zeros(N)
    if rank > 0:
        dist.recv(act, src=rank - 1)
    compute(0.01)
    if rank < last:
        dist.send(act + 1, dst=rank + 1)


def train_step(step, kept_grad):
    act = torch.zeros(N)
    grad = torch.zeros(N)
    if rank == 0:
        compute(0.01)
        dist.send(act + step, dst=1)
        dist.recv(grad, src=1)
    elif rank < last:
        dist.recv(act, src=rank - 1)
        compute(0.01)
        dist.send(act + 1, dst=rank + 1)  # expect: other
        dist.recv(grad, src=rank + 1)
        dist.send(grad, dst=rank - 1)
    else:
        dist.send(kept_grad, dst=rank - 1)  # expect: culprit
        dist.recv(act, src=rank - 1)
        compute(0.01)
        kept_grad = act * 0.5
    return kept_grad


def halo_exchange():
    """Every stage sends to its neighbours, then receives from them (the same code on
    every rank)."""
    mine, theirs = torch.ones(N), torch.zeros(N)
    for peer in (rank + 1, rank - 1):
        if 0 <= peer < world:
            dist.send(mine, dst=peer)  # expect: tie
    for peer in (rank - 1, rank + 1):
        if 0 <= peer < world:
            dist.recv(theirs, src=peer)


dist.all_reduce(torch.ones(1))
if KIND == "symmetric":
    halo_exchange()
else:
    if KIND == "after_eval":
        for _ in range(2):
            forward_only()
    kept = torch.zeros(N)
    for step in range(4):
        kept = train_step(step, kept)
dist.barrier()
dist.destroy_process_group()
