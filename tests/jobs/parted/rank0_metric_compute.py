"""A metric's compute() synchronises its state across ranks (all_gather), and it is
called on rank 0 only, to print a running average every few steps. Modelled on
torchmetrics' `if local_rank == 0: print(metric.compute())` hangs. The parting shows at
once (all_gather against the others' next all_reduce): a control that distdoctor names
today and must keep naming. The line where the paths part is the rank-0-only call of
compute(); the op that has no counterpart is the all_gather inside it. 2 or 4 ranks.
"""
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _common import compute, grads, init  # noqa: E402

rank, world = init()


class RunningMean:
    def __init__(self):
        self.total, self.count = torch.zeros(1), torch.zeros(1)

    def update(self, value):
        self.total += value
        self.count += 1

    def _sync(self):
        state = torch.cat([self.total, self.count])
        gathered = [torch.zeros(2) for _ in range(dist.get_world_size())]
        dist.all_gather(gathered, state)  # expect: parted
        return torch.stack(gathered).sum(0)

    def compute(self):
        total, count = self._sync()
        return total / count


metric = RunningMean()
for step in range(8):
    compute()
    g = grads()
    dist.all_reduce(g)  # expect: other
    metric.update(g.mean())
    if rank == 0 and step % 4 == 3:
        print(f"step {step}: mean {metric.compute().item():.4f}")  # expect: caller
dist.barrier()
