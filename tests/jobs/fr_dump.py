"""A gloo job that goes wrong and leaves PyTorch Flight Recorder dumps, one per rank, the
way a timeout handler would: while the ranks are still where the bug left them.

  TORCH_FR_BUFFER_SIZE=2000 RANK=r WORLD_SIZE=n MASTER_ADDR=.. MASTER_PORT=..
  python fr_dump.py MODE PREFIX [json]

MODE: healthy | skip (the last rank skips an all_reduce and gets stuck outside any
collective) | mismatch (the last rank receives a broadcast into a tensor of another shape).
Each rank writes PREFIX<rank> (pickle, PyTorch's format) or PREFIX<rank>.json, waits
until every rank has written its dump (so no op in flight is torn down by a peer's exit
first), and exits 0. Not run under distdoctor: the dumps are the only record.
"""

import os
import sys
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

MODE, PREFIX = sys.argv[1], sys.argv[2]
AS_JSON = len(sys.argv) > 3 and sys.argv[3] == "json"
DUMP_AFTER_S = 1.0  # after reaching the bug: long enough for every rank to be in place

dist.init_process_group("gloo", timeout=timedelta(seconds=30))
rank, world = dist.get_rank(), dist.get_world_size()
culprit = world - 1
reached = threading.Event()


def path(r: int) -> str:
    return f"{PREFIX}{r}{'.json' if AS_JSON else ''}"


def dump_and_exit() -> None:
    reached.wait()
    time.sleep(DUMP_AFTER_S)
    c10d = torch._C._distributed_c10d
    data = c10d._dump_fr_trace_json() if AS_JSON else c10d._dump_fr_trace()
    with open(path(rank) + ".tmp", "wb") as fh:
        fh.write(data)
    os.replace(path(rank) + ".tmp", path(rank))
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not all(os.path.exists(path(r)) for r in range(world)):
        time.sleep(0.05)
    os._exit(0)


threading.Thread(target=dump_and_exit, daemon=True).start()


def forward_step(step: int) -> None:
    dist.all_reduce(torch.ones(8))
    dist.broadcast(torch.ones(2, 3), src=step % world)
    dist.all_gather_into_tensor(torch.empty(world * 4), torch.ones(4))


for step in range(3):
    forward_step(step)
dist.barrier()  # expect: last
reached.set()
if MODE == "skip":
    if rank == culprit:
        time.sleep(60)  # expect: culprit  (stuck here: never reaches the all_reduce)
    try:
        dist.all_reduce(torch.ones(16))  # expect: waiting
    except RuntimeError:
        pass  # a peer that has dumped already exited first; this rank's dump is written
elif MODE == "mismatch":
    # a receive buffer of another shape: gloo takes the smaller message without complaint
    # (a sender of more data than a peer expects would abort that peer before any dump)
    buf = torch.ones(4, 5) if rank == culprit else torch.ones(4, 4)
    dist.broadcast(buf, src=0)  # expect: mismatch
time.sleep(60)  # the dump thread ends the process
