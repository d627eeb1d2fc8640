"""An all_reduce of a NaN on CUDA under TORCH_DIST_NAN_CHECK=1 with torch's default
`nccl` (nccl2 on torch >= 2.15): torch's NanCheckHook, a pre-hook on the group
(torch 2.15.0 `distributed_c10d.py`, `_new_process_group_helper`), refuses it. Prints
NAN-REFUSED (or NAN-PASSED) per rank, bare and traced alike."""

import os

import torch
import torch.distributed as dist

local = int(os.environ.get("LOCAL_RANK", os.environ["RANK"]))
device = torch.device("cuda", local)
torch.cuda.set_device(device)
dist.init_process_group("nccl", device_id=device)
try:
    dist.all_reduce(torch.tensor([float("nan")], device=device))
    torch.cuda.synchronize()
    print("NAN-PASSED", dist.get_rank(), flush=True)
except RuntimeError as exc:
    print("NAN-REFUSED", dist.get_rank(), str(exc)[:60], flush=True)
dist.destroy_process_group()
