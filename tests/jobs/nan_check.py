"""An all_reduce of a NaN under TORCH_DIST_NAN_CHECK=1: torch 2.15's NanCheckHook, a
pre-hook on the group, refuses it (prints NAN-REFUSED) bare and traced alike."""

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
try:
    dist.all_reduce(torch.tensor([float("nan")]))
    print("NAN-PASSED", dist.get_rank(), flush=True)
except RuntimeError as exc:
    print("NAN-REFUSED", dist.get_rank(), str(exc)[:60], flush=True)
dist.destroy_process_group()
