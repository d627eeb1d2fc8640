"""A job that fills the disk under the run dir while it runs (its own checkpoints, say),
then goes on with more collectives than the event log had space reserved for.

Only for a small file system made for the test (tests/test_chaos.py mounts an 8 MiB
tmpfs): it writes until the disk is full, and refuses to run on a larger one."""

import os

import torch
import torch.distributed as dist

N = int(os.environ.get("FILL_OPS", "12000"))
dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(1)
for i in range(N):
    if i == 100 and rank == 0:
        room = os.statvfs(os.environ["DISTDOCTOR_RUN_DIR"])
        assert room.f_bavail * room.f_frsize < 64 << 20, "not a small test file system"
        with open(os.path.join(os.environ["DISTDOCTOR_RUN_DIR"], "filler"), "wb") as fh:
            try:
                while True:
                    fh.write(b"\0" * (1 << 16))
                    fh.flush()
            except OSError:
                pass  # full
        dist.barrier()
    elif i == 100:
        dist.barrier()
    dist.all_reduce(t)
    t.fill_(1)
dist.barrier()
print(f"rank {rank} done", flush=True)
dist.destroy_process_group()
