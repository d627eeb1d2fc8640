"""Process groups created in a rank-dependent order (a user bug).

4 gloo ranks. Ranks 0 and 1 create new_group([0, 1]) and then new_group([2, 3]); ranks 2
and 3 create the same two groups in the reverse order. torch requires every rank to call
new_group() for every group, in the same order: the groups are named by a counter, so
here the first group of ranks 0/1 ([0, 1]) and the first group of ranks 2/3 ([2, 3]) get
the same name and rendezvous on the same store prefix. Then each rank all-reduces on the
group it belongs to for a few iterations, and all ranks meet in a final barrier. torch sometimes wires this, sometimes hangs.

    distdoctor run --nproc 4 --on-hang kill -- python group_order_race.py

Copied from the shared corpus (rundirs/group_order_race/job.py), unchanged but for this
docstring; tests/security/test_engine_survives.py runs it.
"""

import os
import time

import torch
import torch.distributed as dist

ITERS = int(os.environ.get("ITERS", "10"))

dist.init_process_group("gloo")
rank = dist.get_rank()

if rank < 2:
    g01 = dist.new_group([0, 1])  # BUG: ranks 2 and 3 create [2, 3] first
    g23 = dist.new_group([2, 3])
else:
    g23 = dist.new_group([2, 3])  # BUG: ranks 0 and 1 create [0, 1] first
    g01 = dist.new_group([0, 1])

mine = g01 if rank < 2 else g23
for it in range(ITERS):
    t = torch.full((1024,), float(rank + it))
    dist.all_reduce(t, group=mine)
    time.sleep(0.1)
    if rank == 0:
        print(f"iter {it}: {t[0].item()}", flush=True)

dist.barrier()  # every rank, on the default group, before leaving
dist.destroy_process_group()
