"""DDP; rank 3 keeps pace for 40 steps, then computes extra diagnostics (~25 ms) after
every optimizer step. Unmodified script."""

import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
ONSET = 40


def extra_diagnostics(model):
    end = time.perf_counter() + 0.025
    while time.perf_counter() < end:
        sum(p.detach().abs().sum() for p in model.parameters())  # expect: slow_line


model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(32, 32))
opt = torch.optim.Adam(model.parameters())
for step in range(120):  # past the verdict's 60-step window: the onset is remembered
    loss = model(torch.randn(8, 32)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    if rank == 3 and step >= ONSET:
        extra_diagnostics(model)
dist.destroy_process_group()
