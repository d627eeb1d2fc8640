"""A few DDP steps; rank 0 saves the final parameters to ARGV[1] (for a with/without
tracing comparison) and the job's own output is the only thing that differs."""

import os
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(
    torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
gen = torch.Generator().manual_seed(1 + dist.get_rank())
for _ in range(10):
    loss = model(torch.randn(8, 32, generator=gen)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    dist.all_reduce(loss.detach())
if dist.get_rank() == 0:
    torch.save([p.detach() for p in model.parameters()], sys.argv[1])
dist.barrier()
dist.destroy_process_group()
# Torch's own exit race, untraced too (seen twice in CI, once after the barrier above): a
# gloo worker thread that frees a tensor while the interpreter is finalizing takes the GIL,
# and Python 3.11 ends such a thread with a forced unwind that C++ turns into
# "terminate called without an active exception" (SIGABRT). Leaving without finalizing
# sidesteps it; the comparison needs only the file saved above.
sys.stdout.flush()
os._exit(0)
