"""The job's first collective skipped by one rank (`if rank != 2: dist.barrier()`, as in
pytorch/pytorch#138322): rank 2 exits normally, the others are left in the barrier until
gloo sees its peer gone. Nothing has completed on the group yet, so no call is familiar:
the culprit is rank 2, the one that skipped it, not the ranks that called it."""
import os
import sys

import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bugs"))
from _common import init  # noqa: E402

rank, world = init()
if rank != world - 1:
    dist.barrier()
print(f"rank {rank} done", flush=True)
