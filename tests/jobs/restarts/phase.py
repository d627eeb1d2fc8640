"""One short phase of a job that a script launches many times (tests/test_incarnations.py):
N all_reduces on 2 gloo ranks. PHASE_FAIL_RANK=r makes rank r raise after half of them in
the first elastic round (TORCHELASTIC_RESTART_COUNT 0), so torchrun restarts the job."""

import os
from datetime import timedelta

import torch
import torch.distributed as dist

N = int(os.environ.get("PHASE_OPS", "300"))
FAIL_RANK = int(os.environ.get("PHASE_FAIL_RANK", "-1"))

# PHASE_TIMEOUT bounds a restarted round whose gloo mesh never connects (flaky here)
dist.init_process_group("gloo", timeout=timedelta(
    seconds=float(os.environ.get("PHASE_TIMEOUT", "1800"))))
rank = dist.get_rank()
t = torch.ones(4)
for i in range(N):
    if i == N // 2 and rank == FAIL_RANK and os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0":
        raise RuntimeError("injected failure in the first round")
    dist.all_reduce(t)
dist.barrier()
dist.destroy_process_group()
