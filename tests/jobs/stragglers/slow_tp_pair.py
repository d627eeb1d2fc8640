"""A 2 x 2 (dp x tp) mesh whose second TP pair, ranks 2 and 3, has a slow link: a stand-in
that moves 8192x the bytes per op through that pair that the other pair moves (gloo on one
host cannot slow one link down; the op is slower for real, for both members, inside the
collective). Both then arrive late at their DP all-reduces. No spans. Unmodified script."""

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

dist.init_process_group("gloo")
rank = dist.get_rank()
mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
tp, dp = mesh.get_group("tp"), mesh.get_group("dp")
activations = torch.ones(1024 * (8192 if rank >= 2 else 1))
grads = torch.ones(1024)
for _ in range(60):
    dist.all_reduce(activations, group=tp)  # expect: tp_all_reduce
    dist.all_reduce(grads, group=dp)
print("TP_GROUP", rank, tp.group_name, flush=True)
dist.destroy_process_group()
