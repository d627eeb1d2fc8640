"""DDP whose DataLoader is slow on rank 1 (its shard decodes slowly). Unmodified script:
the steps are the optimizer's."""

import time

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset

dist.init_process_group("gloo")
rank = dist.get_rank()


class Shard(Dataset):
    def __len__(self):
        return 100_000

    def __getitem__(self, i):
        if rank == 1:
            time.sleep(0.004)  # expect: slow_line
        return torch.randn(16), torch.randn(1)


model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step, (x, y) in enumerate(DataLoader(Shard(), batch_size=8)):
    loss = ((model(x) - y) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step == 40:
        break
dist.destroy_process_group()
