"""The healthy twin of the programs beside it: DDP with a DataLoader, and a plain
all-reduce loop, every rank alike. No straggler to find."""

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset

dist.init_process_group("gloo")
data = TensorDataset(torch.randn(4096, 16), torch.randn(4096, 1))
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step, (x, y) in enumerate(DataLoader(data, batch_size=16)):
    loss = ((model(x) - y) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if step == 60:
        break
x = torch.ones(1000)
for _ in range(100):
    dist.all_reduce(x)
dist.destroy_process_group()
