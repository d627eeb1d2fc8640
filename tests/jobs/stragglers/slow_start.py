"""DDP on 2 ranks; rank 1 is slow for its first 20 steps (15 ms of extra work after each
optimizer step, as a cold cache or a late-starting loader would make it), then keeps pace
for 80. A straggler said while it lasts is no straggler over the run. Unmodified script."""

import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
SLOW_STEPS = 20

model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(32, 32))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(SLOW_STEPS + 80):
    loss = model(torch.randn(8, 32)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    time.sleep(0.02)  # every rank's steady work
    if rank == 1 and step < SLOW_STEPS:
        time.sleep(0.015)
dist.destroy_process_group()
