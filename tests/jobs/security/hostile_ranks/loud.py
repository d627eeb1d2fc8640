"""Ranks whose output is hard on whoever relays it (tests/security/test_launch_hostile.py).

usage: loud.py MIB [EXIT [STREAM]]. Both ranks all_reduce once; rank 0 prints MIB MiB to
STREAM (stdout; or stderr) in lines of 100,000 characters, each a run of `\\r` progress
updates with an emoji in every one (a line of 4-byte characters to whoever decodes it);
both meet at a barrier, print "rank R done" and exit with EXIT (0).
"""

import sys

import torch
import torch.distributed as dist

UPDATE = "\U0001f525 45%|####      |\r"
LINE = (UPDATE * (100_000 // len(UPDATE)) + "\n").encode()
mib, code = float(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 0
stream = sys.stderr if sys.argv[3:] == ["stderr"] else sys.stdout

dist.init_process_group("gloo")
rank = dist.get_rank()
dist.all_reduce(torch.ones(1))
if rank == 0:
    for _ in range(int(mib * (1 << 20)) // len(LINE)):
        stream.buffer.write(LINE)
    stream.flush()
dist.barrier()
print(f"rank {rank} done", flush=True)
dist.destroy_process_group()
sys.exit(code)
