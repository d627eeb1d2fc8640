"""A process that makes its default group twice (destroy, then init again, each time at
a fresh file store, as PyTorch's own test suite does): each group is an incarnation."""

import os

import torch
import torch.distributed as dist

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
stores = os.path.join(os.environ["DISTDOCTOR_RUN_DIR"], "stores")
os.makedirs(stores, exist_ok=True)
for round_ in range(2):
    dist.init_process_group("gloo", init_method=f"file://{stores}/round{round_}",
                            rank=rank, world_size=world)
    t = torch.ones(2)
    for _ in range(3 + round_):
        dist.all_reduce(t)
    dist.barrier()
    dist.destroy_process_group()
