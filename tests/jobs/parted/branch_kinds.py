"""One job per kind of branch that splits the ranks (issue 41), chosen by argv[1].

Each kind is a shape seen in public bug reports; the culprit's op carries `expect:
parted`, the branch `expect: branch`. With two ranks no majority names the culprit:
the condition must.
- rank_name: `if rank == 0:` around an extra all_reduce (rank 0);
- rank_bound: a name bound from get_rank() at module level guards a barrier (rank 0);
- framework_prop: a trainer state's `is_world_process_zero` guards a gather (rank 0);
- decorator: a `@rank_zero_only` report all-reduces (rank 0);
- data_none: `if batch is not None:` holds the all_gather; rank 1's batch is None in
  step 2 (rank 1, whose data sent it past);
- early_return: a step returns early on a bad loss, before its all_gather (rank 1);
- loop_break: a rank-guarded `break` leaves the epoch loop on rank 1 (rank 1);
- except_continue: rank 1's sample fails to parse; its `except` arm skips the sync
  (rank 1);
- rank_gate: `if dist.get_rank() != 0: return` opens a save helper whose barrier only
  rank 0 reaches (rank 0);
- even_split: 4 ranks, `if rank % 2 == 0:` around a barrier (ranks 0, 2);
- healthy: each of these shapes written right (rank-0 work with no collective under
  it, a rank-0 broadcast that the others receive, a designed main-process-first
  barrier): quiet.
"""
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _common import compute, grads, init  # noqa: E402

kind = sys.argv[1]
rank, world = init()
is_logger = dist.get_rank() == 0


class TrainerState:
    @property
    def is_world_process_zero(self):
        return dist.get_rank() == 0


def rank_zero_only(fn):  # as Lightning's: the function runs on global rank 0 only
    def wrapped(*args, **kwargs):
        if dist.get_rank() == 0:
            return fn(*args, **kwargs)
        return None
    return wrapped


@rank_zero_only
def report(norm):
    dist.all_reduce(norm)  # expect: parted
    print(f"grad norm {float(norm):.3f}")


def batch_for(step):
    return None if (rank == 1 and step == 2) else torch.ones(4)


def step_with_early_return(step):
    dist.all_reduce(grads())
    loss = float("nan") if (rank == 1 and step == 2) else 1.0
    if loss != loss:  # expect: branch
        return None
    out = [torch.zeros(1) for _ in range(world)]
    dist.all_gather(out, torch.ones(1))  # expect: parted
    return out


def save_state(step):
    """Writes the state on the main process."""
    path = os.devnull
    if dist.get_rank() != 0:  # expect: branch
        return
    torch.save({"step": step}, path)
    dist.barrier()  # expect: parted


def parse(step):
    if rank == 1 and step == 2:
        raise ValueError("bad sample")
    return torch.ones(2)


state = TrainerState()
dist.all_reduce(grads())  # everyone is up
for step in range(4):
    compute()
    g = grads()
    dist.all_reduce(g)
    if kind == "rank_name":
        if rank == 0 and step == 2:  # expect: branch
            dist.all_reduce(g)  # expect: parted
    elif kind == "rank_bound":
        if is_logger and step == 2:  # expect: branch
            dist.barrier()  # expect: parted
    elif kind == "framework_prop":
        if state.is_world_process_zero and step == 2:  # expect: branch
            out = [torch.zeros(64) for _ in range(world)]
            dist.all_gather(out, g)  # expect: parted
    elif kind == "decorator":
        if step == 2:
            report(g.norm().reshape(1))
    elif kind == "data_none":
        batch = batch_for(step)
        if batch is not None:  # expect: branch
            out = [torch.zeros(4) for _ in range(world)]
            dist.all_gather(out, batch)  # expect: parted
    elif kind == "early_return":
        step_with_early_return(step)
    elif kind == "loop_break":
        for micro in range(3):
            dist.all_reduce(grads(8))
            if rank == 1 and step == 2 and micro == 1:  # expect: branch
                break  # expect: parted
    elif kind == "except_continue":
        try:  # expect: branch
            value = parse(step)
            dist.all_reduce(value)  # expect: other
        except ValueError:  # expect: parted
            continue
    elif kind == "rank_gate":
        if step == 2:
            save_state(step)
    elif kind == "even_split":
        if rank % 2 == 0 and step == 2:  # expect: branch
            dist.barrier()  # expect: parted
    elif kind == "healthy":
        if rank == 0:
            torch.save(g, os.devnull)  # rank-0 work with no collective under it
        if is_logger and step == 1:
            report_value = torch.tensor([float(step)])
        else:
            report_value = torch.zeros(1)
        dist.broadcast(report_value, src=0)  # rank 0 broadcasts what the others receive
        if rank != 0:
            dist.barrier()  # main process first: the others wait while it prepares
        if rank == 0:
            compute(0.05)
            dist.barrier()
dist.barrier()
