"""A rank that stops making progress while the other waits for it, one way per KIND:

  python hangs.py KIND      (2 ranks, gloo)

  compute  blocked in a native call that never returns (a read no one answers)
  sleep    time.sleep, forever
  lock     a lock taken twice
  queue    a queue no one feeds
  spin     a busy loop on one line
  dead     the rank is SIGKILLed
Rank 1 is the culprit; rank 0 waits in an all_reduce. No --hang-timeout is needed.
"""
import os
import queue
import signal
import sys
import threading
import time

import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bugs"))
from _common import grads, init  # noqa: E402

KIND = sys.argv[1]
rank, world = init()


def stuck():
    if KIND == "compute":
        r, _w = os.pipe()
        os.read(r, 1)  # expect: compute
    elif KIND == "sleep":
        while True:
            time.sleep(3600)  # expect: sleep
    elif KIND == "lock":
        lock = threading.Lock()
        lock.acquire()
        lock.acquire()  # expect: lock
    elif KIND == "queue":
        queue.Queue().get()  # expect: queue
    elif KIND == "spin":
        x = 0
        while x >= 0: x += 1  # noqa: E701  # expect: spin
    elif KIND == "dead":
        os.kill(os.getpid(), signal.SIGKILL)  # expect: dead


for step in range(4):
    if rank == 1 and step == 2:
        stuck()
    dist.all_reduce(grads())  # expect: others
