"""Rank 1 runs a helper process that makes a one-rank gloo group of its own (an evaluation
harness, a converter: traced as a newer incarnation of the job, since every Python process
run starts is traced), then never joins the next all_reduce; rank 0 waits in it.

  python helper_group_then_hang.py      (2 ranks, gloo)
"""
import os
import subprocess
import sys
import time

import torch.distributed as dist

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bugs"))
from _common import grads, init  # noqa: E402

HELPER = """
import datetime, socket, torch, torch.distributed as dist
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1,
                        timeout=datetime.timedelta(seconds=30))
dist.all_reduce(torch.ones(4))
dist.destroy_process_group()
"""

rank, world = init()
for step in range(4):
    if rank == 1 and step == 2:
        subprocess.run([sys.executable, "-c", HELPER], check=True, timeout=60)
        while True:
            time.sleep(3600)  # expect: stuck
    dist.all_reduce(grads())  # expect: others
