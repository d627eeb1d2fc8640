"""A job whose worker thread ends itself with sys.exit(3), as threads are often told to:
SystemExit there ends the thread only, and the ranks go on to finish, exit status 0."""

import sys
import threading

import torch
import torch.distributed as dist

dist.init_process_group("gloo")


def worker() -> None:
    sys.exit(3)  # this thread is done; the rank is not


thread = threading.Thread(target=worker)
thread.start()
thread.join()
t = torch.ones(2)
for _ in range(20):
    dist.all_reduce(t)
dist.barrier()
print(f"rank {dist.get_rank()}: {t.tolist()}", flush=True)
dist.destroy_process_group()
