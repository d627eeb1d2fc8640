"""Every rank fails mid-run, after collectives have completed: not a start-up failure.

`keyerror`: every rank looks up a metric its dict lacks in step 6 (the same KeyError on
every rank, as when a config key was renamed and only the logging path reads it).
`bad_src`: in step 6 every rank calls broadcast_object_list on a subgroup of ranks 0-1
with `src=2`, a global rank outside the group: torch raises ValueError inside the
collective API. Modelled on public reports where a mid-run error was said as a start-up
failure. 2 ranks for keyerror, 3 for bad_src.
"""
import sys

import torch.distributed as dist

sys.path.insert(0, __file__.rsplit("/", 2)[0] + "/bugs")
from _common import grads, init  # noqa: E402

mode = sys.argv[1] if len(sys.argv) > 1 else "keyerror"
rank, world = init()
sub = dist.new_group([0, 1]) if mode == "bad_src" else None
metrics = {"loss": 0.0}
for step in range(1, 10):
    g = grads()
    dist.all_reduce(g)
    metrics["loss"] = float(g[0])
    if step == 6:
        if mode == "keyerror":
            print(f"step {step} acc {metrics['accuracy']}")  # expect: raise
        elif rank in (0, 1):
            box = [metrics]
            dist.broadcast_object_list(box, src=2, group=sub)  # expect: raise
        else:
            dist.barrier()
dist.barrier()
