"""The epoch-end gather on the main process only (Lightning's `self.all_gather` under
`if self.trainer.is_global_zero:`, Accelerate's `gather_object` under
`if accelerator.is_main_process:`): rank 1 finishes and exits normally, rank 0 is left
alone in its extra collective. The culprit is rank 0, at the gather's line."""
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bugs"))
from _common import grads, init  # noqa: E402

rank, world = init()
for _step in range(3):
    dist.all_reduce(grads())
metric = torch.tensor([float(rank)])
if rank == 0:  # is_global_zero
    gathered = [torch.zeros(1) for _ in range(world)]
    dist.all_gather(gathered, metric)  # expect: culprit
print(f"rank {rank} done", flush=True)
