"""A logging thread that shares the default group with the training loop, but in lock-step:
the main thread hands it a turn after every step and waits for it, so every rank issues
the same collectives in the same order and the job is healthy. It is still a hazard (the
day the hand-off goes, the order across threads is left to the scheduler), worth an info
finding while the job runs, and nothing more. 2 ranks.
"""
import sys
import threading

import torch
import torch.distributed as dist

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _common import compute, grads, init  # noqa: E402

rank, world = init()
turn, done = threading.Event(), threading.Event()


def log_loss():
    for _ in range(4):
        turn.wait()
        turn.clear()
        loss = torch.tensor([1.0])
        dist.all_reduce(loss)  # expect: thread
        done.set()


threading.Thread(target=log_loss, name="loss-logger", daemon=True).start()
for _step in range(4):
    compute()
    g = grads()
    dist.all_reduce(g)  # expect: main
    turn.set()
    done.wait()
    done.clear()
dist.barrier()
