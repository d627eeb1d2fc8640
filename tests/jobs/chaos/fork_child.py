"""A rank (rank 1) that forks mid-job. The child lives CHILD_S seconds while its parent
goes on with all_reduces, then ends with sys.exit(0) (its atexit handlers run,
distdoctor's among them) or, with CHAOS_FORK_EXIT=_exit, with os._exit(0). The parent
reaps it as soon as it has ended (and prints a line then), and keeps doing all_reduces
until CHAOS_AFTER_S seconds after the fork. Each rank prints how many all_reduces it
issued before and after the fork.

A forked child that finalizes the interpreter hangs in ProcessGroupGloo's destructor (its
threads are the parent's), with or without distdoctor: the child's last atexit handler
(registered first, so it runs after every other one) ends it there."""

import atexit
import os
import sys
import time

PARENT = os.getpid()
atexit.register(lambda: os.getpid() != PARENT and os._exit(0))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

BEFORE = 50
CHILD_S = 0.3
AFTER_S = float(os.environ.get("CHAOS_AFTER_S", "2.5"))
HOW = os.environ.get("CHAOS_FORK_EXIT", "sys.exit")

dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(2)
for _ in range(BEFORE):
    dist.all_reduce(t)
    t.fill_(1)
    time.sleep(0.01)

child = None
if rank == 1:
    sys.stdout.flush()
    sys.stderr.flush()
    child = os.fork()
    if child == 0:
        time.sleep(CHILD_S)
        if HOW == "_exit":
            os._exit(0)
        sys.exit(0)


def reap(flags: int) -> None:
    global child
    pid, raw = os.waitpid(child, flags)
    if pid:
        print(f"rank {rank}: the forked child exited with {os.waitstatus_to_exitcode(raw)}"
              f"\n", end="", flush=True)
        child = None


# the ranks agree on when to stop: the all_reduce of "time is up" (MAX)
start, after = time.monotonic(), 0
while True:
    flag = torch.tensor([1.0 if time.monotonic() - start > AFTER_S else 0.0])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    after += 1
    if child:
        reap(os.WNOHANG)
    if flag.item():
        break
    time.sleep(0.005)
if child:
    reap(0)
dist.barrier()
print(f"rank {rank} done: {BEFORE} all_reduces before the fork, {after} after\n", end="",
      flush=True)
dist.destroy_process_group()
