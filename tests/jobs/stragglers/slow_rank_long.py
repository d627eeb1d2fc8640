"""DDP in which the last rank computes 30 ms longer than the others at every step, for
~15 s: long enough for the collector to judge it from the nodes' digests (collect/
lateness.py looks at 10 s of waits). Unmodified script: no spans."""

import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(400):
    x, y = torch.randn(8, 16), torch.randn(8, 1)
    time.sleep(0.040 if rank == world - 1 else 0.010)  # expect: slow_line
    loss = ((model(x) - y) ** 2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
dist.destroy_process_group()
