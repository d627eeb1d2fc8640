"""A rank that closes every file descriptor above 2 that is not a socket in the middle of
the job (as a daemonising library does), then opens files of its own, which get the
numbers back, writes known amounts to them and keeps doing all_reduces with the files open.

Gloo's sockets and its epoll descriptor (an anon inode) are kept: closing them breaks the
job with or without distdoctor (gloo's loop aborts on a closed epoll descriptor). The rest
goes: torch's pipes, and under distdoctor its event log, the mmap's own copy of that
descriptor and the stack-dump file.
CHAOS_OUT: the folder for the files (one per rank: `rank-R.K` holds K KiB plus R bytes,
K = 1..FILES). Every rank prints the sum it reduced and the sizes it finds, the same with
or without distdoctor."""

import os
import stat
import time

import torch
import torch.distributed as dist

OPS = int(os.environ.get("CHAOS_OPS", "300"))
FILES = 12
OUT = os.environ["CHAOS_OUT"]

dist.init_process_group("gloo")
rank = dist.get_rank()


def close_everything_but_sockets() -> int:
    closed = 0
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd <= 2:
            continue
        try:
            if stat.S_ISSOCK(os.fstat(fd).st_mode) or os.readlink(
                    f"/proc/self/fd/{fd}").startswith("anon_inode:"):
                continue
            os.close(fd)
            closed += 1
        except OSError:
            pass  # the listing's own descriptor, gone already
    return closed


total, files = 0.0, []
for i in range(OPS):
    if i == OPS // 3:
        closed = close_everything_but_sockets()
        for k in range(1, FILES + 1):  # the lowest free numbers: those just closed
            fd = os.open(os.path.join(OUT, f"rank-{rank}.{k}"),
                         os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
            os.write(fd, b"x" * (k * 1024 + rank))
            files.append(fd)
    t = torch.full((4,), float(i + rank))
    dist.all_reduce(t)
    total += float(t[0])
    if files and i % 20 == 0:
        for k, fd in enumerate(files, start=1):
            os.write(fd, b"y" * k)  # more of the job's own writes, known amounts
    time.sleep(0.01)
dist.barrier()
sizes = [os.fstat(fd).st_size for fd in files]
for fd in files:
    os.close(fd)
print(f"rank {rank} done: sum {total:g} sizes {sizes}\n", end="", flush=True)
dist.destroy_process_group()
