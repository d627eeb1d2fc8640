"""Each rank first receives from the other, then sends: both block in recv."""
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from _common import init  # noqa: E402

rank, world = init()
peer = 1 - rank
buf = torch.zeros(1024)
dist.all_reduce(torch.ones(1))
dist.recv(buf, src=peer)  # expect: culprit
dist.send(torch.ones(1024), dst=peer)
