"""tests/jobs/hook_count.py (the CPU test's job, unchanged) on CUDA with torch's default
`nccl`: every tensor it makes goes to this rank's GPU (`torch.set_default_device`) and
its `init_process_group("gloo")` becomes `init_process_group("nccl", device_id=...)`.
ARGV[1]: the folder for hooks-RANK.json, as hook_count.py writes it."""

import os
import runpy
import sys
from pathlib import Path

import torch
import torch.distributed as dist

local = int(os.environ.get("LOCAL_RANK", os.environ["RANK"]))
device = torch.device("cuda", local)
torch.cuda.set_device(device)
torch.set_default_device(device)
_init = dist.init_process_group


def init_on_nccl(backend=None, *args, **kwargs):
    kwargs.setdefault("device_id", device)
    return _init("nccl", *args, **kwargs)


dist.init_process_group = init_on_nccl
JOB = Path(__file__).resolve().parents[2] / "jobs" / "hook_count.py"
sys.argv = [str(JOB), *sys.argv[1:]]
runpy.run_path(str(JOB), run_name="__main__")
