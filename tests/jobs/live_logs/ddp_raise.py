"""DDP on gloo: rank 1 raises ValueError in forward at step 3 while the others wait for it in
the gradient all-reduce (their timeout is long: the diagnosis must not wait for it)."""

import os
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 8)

    def forward(self, x, step):
        if dist.get_rank() == 1 and step == 3:
            raise ValueError(f"bad batch at step {step}")  # expect: raise
        return self.fc(x)


def main():
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    model = DDP(Net())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(6):
        loss = model(torch.ones(4, 8), step).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
        print(f"rank {dist.get_rank()} step {step}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
