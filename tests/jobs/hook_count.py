"""Every kind of op with a counting pre/post hook on the world group (torch >= 2.14:
ProcessGroup.register_pre_hook / register_post_hook), then the counts, the hook names and
torch's own Flight Recorder entries written to ARGV[1]/hooks-RANK.json. Run on 2 ranks,
bare and under `distdoctor run`: the files must be equal.

Ops: all_reduce, barrier, all_gather_into_tensor, a p2p pair, batch_isend_irecv, a
coalesced ops (all_reduce_coalesced;
all_gather_into_tensor_coalesced, the method torch's _coalescing_manager calls), reduce_scatter_tensor, a functional
collective (DTensor's path), one DDP step.
"""

import json
import os
import pickle
import sys
from collections import Counter

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
pg = dist.group.WORLD
seen = {"pre": Counter(), "post": Counter(), "post_work": 0, "pairs": 0}
open_ids = set()


def pre(args):
    seen["pre"][args.name.name] += 1
    open_ids.add(args.op_id)


def post(args):
    seen["post"][args.name.name] += 1
    seen["post_work"] += args.work is not None
    seen["pairs"] += args.op_id in open_ids


pg.register_pre_hook(4242, pre)
pg.register_post_hook(4242, post)

dist.all_reduce(torch.ones(3))
dist.barrier()
dist.all_gather_into_tensor(torch.empty(2 * world), torch.ones(2))
peer = 1 - rank
if rank == 0:
    dist.send(torch.ones(2), dst=peer)
    dist.recv(torch.empty(2), src=peer)
else:
    dist.recv(torch.empty(2), src=peer)
    dist.send(torch.ones(2), dst=peer)
for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.ones(2), peer),
                                 dist.P2POp(dist.irecv, torch.empty(2), peer)]):
    w.wait()
dist.all_reduce_coalesced([torch.ones(2), torch.ones(3)])
opts = torch._C._distributed_c10d.AllgatherOptions()
pg.allgather_into_tensor_coalesced([torch.empty(2 * world)], [torch.ones(2)], opts).wait()
dist.reduce_scatter_tensor(torch.empty(2), torch.ones(2 * world))
funcol.wait_tensor(funcol.all_reduce(torch.ones(4), "sum", pg))
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 8))
model(torch.randn(2, 8)).sum().backward()
dist.barrier()

pg.unregister_pre_hook(4242)
pg.unregister_post_hook(4242)
fr = pickle.loads(torch._C._distributed_c10d._dump_fr_trace())
out = {"pre": dict(seen["pre"]), "post": dict(seen["post"]), "post_work": seen["post_work"],
       "pairs": seen["pairs"], "group": type(pg).__name__,
       "fr": [e["profiling_name"] for e in fr.get("entries", [])]}
with open(os.path.join(sys.argv[1], f"hooks-{rank}.json"), "w") as fh:
    json.dump(out, fh)
dist.destroy_process_group()
