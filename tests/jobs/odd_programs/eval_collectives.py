"""A job that issues its collectives through exec() of a string (a config's expression,
a templated step), so each call runs code compiled anew: from "<string>", or with ARGV[2]
"named", under this file's own name (as a tool that templates a file's text compiles it).
Each rank prints how much its anonymous resident memory grew between op WARM and the last
op (ARGV[1] ops; the event log's pages are a file's, not counted)."""

import sys

import torch
import torch.distributed as dist

OPS, WARM = int(sys.argv[1]) if len(sys.argv) > 1 else 20000, 2000
STEP = "dist.all_reduce(t)\n"
NAME = __file__ if sys.argv[2:] == ["named"] else "<string>"


def resident_kb() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssAnon"))


dist.init_process_group("gloo")
t = torch.ones(2)
for i in range(OPS):
    exec(compile(STEP, NAME, "exec"))  # compiled again each time: a new code object
    t.fill_(1)
    if i == WARM:
        start = resident_kb()
print(f"rank {dist.get_rank()}: anonymous memory grew {resident_kb() - start} kB over "
      f"{OPS - WARM} ops", flush=True)
dist.destroy_process_group()
