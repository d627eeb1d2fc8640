"""torch >= 2.15, default `nccl` (ProcessGroupNCCL2): a mixed loop of ops on CUDA, then
torch's own Flight Recorder of them, written to ARGV[1]/fr-RANK.json. Run on 2 ranks with
TORCH_FR_BUFFER_SIZE set, bare and under `distdoctor run`: the entries must be equal.

nccl2 has no recorder of its own: torch attaches its FlightRecorderHook (a pre/post hook
on the group) and the entries go to the recorder instance named after the backend
(torch 2.15.0 `hooks/FlightRecorderHook.hpp`; `FlightRecorder.hpp`, `getFlightRecorder`;
`_dump_fr_trace(..., backend=...)`, whose default is "gloo"). So the dump is asked of the
name the group's CUDA backend calls itself ("nccl2", `nccl2/ProcessGroupNCCL.hpp`,
`kBackendName`).
"""

import json
import os
import pickle
import sys
import time

import torch
import torch.distributed as dist

local = int(os.environ.get("LOCAL_RANK", os.environ["RANK"]))
device = torch.device("cuda", local)
torch.cuda.set_device(device)
dist.init_process_group("nccl", device_id=device)
rank, world = dist.get_rank(), dist.get_world_size()
pg = dist.group.WORLD
name = pg._get_backend(device).name()

for step in range(5):
    dist.all_reduce(torch.ones(1024, device=device))
    dist.broadcast(torch.ones(16, device=device), src=step % world)
    dist.all_gather_into_tensor(torch.empty(8 * world, device=device),
                                torch.ones(8, device=device))
    dist.reduce_scatter_tensor(torch.empty(8, device=device),
                               torch.ones(8 * world, device=device))
peer = 1 - rank
if rank == 0:
    dist.send(torch.ones(4, device=device), dst=peer)
else:
    dist.recv(torch.empty(4, device=device), src=peer)
dist.barrier()
torch.cuda.synchronize()
time.sleep(0.5)  # completions are pushed from the backend's side: let them land

raw = torch._C._distributed_c10d._dump_fr_trace(backend=name)
fr = pickle.loads(raw)
entries = fr.get("entries", [])
out = {"backend_name": name, "version": fr.get("version"),
       "entries": [e["profiling_name"] for e in entries],
       "states": sorted({e["state"] for e in entries}),
       "group": type(pg).__name__}
with open(os.path.join(sys.argv[1], f"fr-{rank}.json"), "w") as fh:
    json.dump(out, fh)
dist.destroy_process_group()
