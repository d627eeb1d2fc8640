"""torch.compile with functional collectives, 2 ranks on gloo: a few healthy steps, then
a compiled function that takes another branch on rank 1 (a flag computed per rank), so
the ranks' compiled graphs issue different collectives. Each collective is issued by
inductor's generated code; the finding must name the lines below. The broadcast is a
graph break: dynamo calls the traced group's method eagerly (it once failed the job).

    distdoctor run --nproc 2 -- python compiled_branch.py [--healthy]
"""

import datetime
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as fc

BACKEND = os.environ.get("COMPILE_BACKEND", "inductor")


@torch.compile(backend=BACKEND)
def step(x):
    y = x * 2
    y = fc.all_reduce(y, "sum", dist.group.WORLD)  # expect: healthy
    dist.broadcast(y, 0)  # expect: graph_break
    return y + 1


@torch.compile(backend=BACKEND)
def sync_stats(x, gather: bool):
    x = x + 1
    if gather:
        return fc.all_gather_tensor(x, 0, dist.group.WORLD)  # expect: other
    return fc.all_reduce(x, "sum", dist.group.WORLD)  # expect: culprit


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    x = torch.ones(8)
    for _ in range(3):
        step(x)
    if "--healthy" not in sys.argv:
        sync_stats(x, rank != 1)  # expect: caller
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
