"""Rank 1 raises an exception of the program's own (no known distributed failure) after two
steps; rank 0 waits in the next all_reduce until gloo reports the closed connection. The
raise shows twice to distdoctor (the traceback in the job's output, the tracer's record of
it) and is one crash; rank 0's error is its consequence."""

import torch
import torch.distributed as dist


class CheckpointWriteError(Exception):
    pass


dist.init_process_group("gloo")
rank = dist.get_rank()
for step in range(5):
    t = torch.ones(2)
    dist.all_reduce(t)
    if step == 2 and rank == 1:
        raise CheckpointWriteError("could not write shard 1 to /ckpt/step2")  # expect: raise
dist.destroy_process_group()
