"""Why the ranks parted, said from what each rank did (issue 48), one job per kind, chosen
by argv[1]. 2 ranks (no majority names the culprit); the culprit's line carries `expect:
parted`, the statement that split the ranks `expect: branch`.
- skip_world_subgroup: a rank with no local gradients skips the all_gather on a subgroup
  whose members are the world's (a sharded optimizer's gather), at the first step, and
  goes on to the loss all_reduce: it skipped a call, it used no wrong group (rank 1);
- callee_return: the caller's `if should_sync(lr):` holds the all_gather; inside it, an
  early return on a float one ulp apart on rank 1 is what split the ranks (rank 1);
- periodic_rank_guard: `if step % 2 == 0:` then `if rank == 0:` around a barrier inside a
  save (the torch.save habit carried over to a collective save): the inner rank guard,
  rank 0 (rank 1 did nothing wrong);
- leave_batch_loop: rank 1 runs out of batches a step early and leaves the batch loop,
  whose body also loops over the parameters: the batch loop is the one left (rank 1);
- slow_sampler: rank 1's sampler hands it a batch that takes 5 s to prepare in step 2,
  under a process-group timeout of 3 s (PARTED_GLOO_TIMEOUT=3): rank 0's all_reduce
  times out while rank 1 computes; a straggler with that timeout, not a hang (rank 1);
- healthy: the same shapes written right: quiet.
"""
import math
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _common import compute, grads, init  # noqa: E402

kind = sys.argv[1]
rank, world = init()
everyone = dist.new_group(list(range(world)))  # a subgroup equal to the world
dist.barrier()


def has_local_grads(step):
    return not (kind == "skip_world_subgroup" and rank == world - 1 and step == 0)


def should_sync(lr):
    if lr < 0.1:  # expect: branch
        return False
    return True


def save(tensor):
    """A collective save: every rank must call it (its barrier)."""
    dist.barrier()  # expect: parted
    torch.save(tensor, "/dev/null")


def skewed_batch(step):
    """Busy preparing the batch: 5 s on rank 1 in step 2, a moment otherwise."""
    until = time.time() + (5.0 if (rank == 1 and step == 2) else 0.01)
    n = 0
    while time.time() < until:  # expect: computing
        n += 1  # expect: computing
    return torch.ones(8)


params = [torch.ones(4), torch.ones(4)]
batches = 3 if (kind == "leave_batch_loop" and rank == 1) else 4
for step in range(4):
    compute()
    g = grads()
    if kind == "skip_world_subgroup":
        if has_local_grads(step):  # expect: branch
            out = [torch.zeros(64) for _ in range(world)]
            dist.all_gather(out, g, group=everyone)  # expect: other
        dist.all_reduce(torch.ones(1))  # expect: parted
    elif kind == "callee_return":
        lr = 0.1 if (rank == 0 or step != 2) else math.nextafter(0.1, 0.0)
        dist.all_reduce(g)
        if should_sync(lr):
            out = [torch.zeros(64) for _ in range(world)]
            dist.all_gather(out, g)  # expect: other
    elif kind in ("periodic_rank_guard", "healthy"):
        dist.all_reduce(g)
        if step % 2 == 1:
            if kind == "healthy" or rank == 0:  # expect: branch
                save(g)  # expect: caller
    elif kind == "slow_sampler":
        dist.all_reduce(skewed_batch(step))
    elif kind == "leave_batch_loop":
        if step >= batches:  # expect: branch
            break  # expect: parted
        for p in params:
            dist.all_reduce(p)
dist.barrier()
