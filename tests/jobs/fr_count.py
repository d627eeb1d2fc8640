"""A mixed loop of collectives and DDP steps, then the Flight Recorder's own record of
them (an independent count) written to ARGV[1]/fr-RANK.json. Run with
TORCH_FR_BUFFER_SIZE set. Only ops that gloo's Flight Recorder logs one-to-one are used
(it logs no p2p, and splits reduce_scatter into several all_reduces).
"""

import json
import os
import pickle
import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 16))
for step in range(20):
    dist.all_reduce(torch.ones(3))
    dist.broadcast(torch.ones(2), src=step % world)
    dist.all_gather_into_tensor(torch.empty(world), torch.ones(1))
    dist.all_to_all_single(torch.empty(world), torch.ones(world))
    model(torch.randn(2, 16)).sum().backward()
    if step % 5 == 0:
        dist.barrier()

fr = pickle.loads(torch._C._distributed_c10d._dump_fr_trace())
names = [e["profiling_name"].split(":", 1)[-1] for e in fr.get("entries", [])]
with open(os.path.join(sys.argv[1], f"fr-{rank}.json"), "w") as fh:
    json.dump(names, fh)
dist.destroy_process_group()
