"""The shapes the engine's ingest must keep apart, in one short job (test_native_ingest):
DDP steps with an optimizer (the tracer's implicit step spans); a span-less all-reduce
loop (its steps: the turns of its repeating pattern); a thread all-reducing on a group of
its own beside it; a send/recv exchange (p2p: each rank's activity kept from then on);
and a loop of two all-reduces on two lines after it. Each loop computes a little between
its collectives, in a function and in a comprehension, for the sampler's lines."""
import threading
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
own = dist.new_group(backend="gloo")
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)


def compute(ms: float) -> None:
    end = time.monotonic() + ms / 1000
    while time.monotonic() < end:
        sum(i * i for i in range(200))  # (a comprehension's line: its function's)


for _ in range(20):
    compute(8)
    loss = model(torch.randn(4, 8)).sum()
    opt.zero_grad()
    loss.backward()
    opt.step()


def metrics():
    for n in range(10):
        dist.all_reduce(torch.tensor([float(n)]), group=own)


thread = threading.Thread(target=metrics)
thread.start()
x = torch.ones(16)
for i in range(60):
    if i % 6 == 0:
        compute(10)
    dist.all_reduce(x)
thread.join()
for i in range(5):
    if rank == 0:
        dist.send(torch.ones(4) * i, dst=1)
    elif rank == 1:
        dist.recv(torch.empty(4), src=0)
for _ in range(40):
    dist.all_reduce(x)
    dist.all_reduce(torch.ones(3))
dist.destroy_process_group()
