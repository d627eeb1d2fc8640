"""One batch_isend_irecv ring exchange: each rank sends to the next and receives from the
previous (on one rank, to and from itself), then prints how many Works torch handed back
and whether the right values arrived. A coalesced batch (NCCL's groupStart/groupEnd
around its ops) returns one Work; a batch issued op by op returns one per op. Unmodified
script, for `distdoctor run` and bare `torchrun` alike: the two must print the same.

    distdoctor run --nproc 2 -- tests/jobs/batched_p2p.py [gloo|nccl] [MiB]
"""

import json
import os
import sys

import torch
import torch.distributed as dist

backend = sys.argv[1] if len(sys.argv) > 1 else "gloo"
mib = int(sys.argv[2]) if len(sys.argv) > 2 else 1
if backend == "nccl":
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
else:
    device = torch.device("cpu")
    dist.init_process_group(backend)
rank, world = dist.get_rank(), dist.get_world_size()
peer, prev = (rank + 1) % world, (rank - 1) % world
n = (mib << 20) // 4  # float32: larger than NCCL's buffer, so a lone send waits on its peer
sent = torch.full((n,), float(rank + 1), device=device)
got = torch.zeros(n, device=device)
ops = [dist.P2POp(dist.isend, sent, peer), dist.P2POp(dist.irecv, got, prev)]
works = dist.batch_isend_irecv(ops)  # expect: batch
for work in works:
    work.wait()
if device.type == "cuda":
    torch.cuda.synchronize()
right = bool((got == float(prev + 1)).all())
print("BATCH " + json.dumps({"rank": rank, "works": len(works), "right": right}), flush=True)
dist.barrier()
dist.destroy_process_group()
