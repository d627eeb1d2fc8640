"""A hang the host cannot see: a kernel spins on device memory nobody writes, the next
all_reduce queues behind it on the GPU, and the host goes on (it only sleeps).

Unmodified script, run under `distdoctor run --nproc N`. Rank SPIN (the last rank) starts
the spinning kernel; on 2 ranks the other rank's all_reduce waits for it on its GPU too.
Every rank prints HOST_GOES_ON once its host is past the stuck op. The job ends by itself
after LIMIT_S (exit 3) if nobody stops it.

    distdoctor run --nproc 1 --hang-timeout 5 --on-hang kill -- tests/gpu/jobs/cuda_hang.py
"""

import os
import sys
import time

import torch
import torch.distributed as dist

LIMIT_S = 150


try:  # Triton comes with torch's CUDA builds; the kernel must live at module level
    import triton
    import triton.language as tl

    @triton.jit
    def wait_for_flag(flag_ptr, limit):
        i = tl.program_id(0) * 0
        while (tl.load(flag_ptr, volatile=True) == 0) & (i < limit):
            i += 1
except ImportError:
    wait_for_flag = None


def spin_on(flag: torch.Tensor) -> str:
    """Start a kernel that waits until flag[0] != 0 (never); returns how it spins."""
    if wait_for_flag is not None:
        try:
            wait_for_flag[(1,)](flag, 2**31 - 1)
            return "Triton kernel polling device memory"
        except Exception as exc:  # Triton cannot build here: spin on the clock instead
            why = f"Triton failed: {type(exc).__name__}: {str(exc)[:200]}"
    else:
        why = "no Triton"
    torch.cuda._sleep(1 << 40)  # ~9 minutes at 2 GHz
    return f"torch.cuda._sleep ({why})"


local_rank = int(os.environ["LOCAL_RANK"])
device = torch.device("cuda", local_rank)
torch.cuda.set_device(device)
dist.init_process_group("nccl", device_id=device)
rank, world = dist.get_rank(), dist.get_world_size()
x = torch.ones(1024, device=device)
for _ in range(3):
    dist.all_reduce(x)  # expect: healthy
torch.cuda.synchronize()
flag = torch.zeros(1, dtype=torch.int32, device=device)
if rank == world - 1:
    print(f"[rank {rank}] spinning: {spin_on(flag)}", flush=True)
dist.all_reduce(x)  # expect: stuck
print(f"[rank {rank}] HOST_GOES_ON", flush=True)
deadline = time.monotonic() + LIMIT_S
while time.monotonic() < deadline:
    time.sleep(0.2)
print(f"[rank {rank}] nobody stopped the job in {LIMIT_S} s", flush=True)
sys.stdout.flush()
os._exit(3)
