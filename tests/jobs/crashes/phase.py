"""A crash said with its phase (issue 48): the step the rank was in, or that the steps
were over. A loop with no spans (the tracer's own step detection numbers the turns of
its collectives), 2 ranks, argv[1]:
- in_step: rank 1 raises in step 12 of 20 (its all_reduce of step 11 done);
- after_loop: the loop of 8 steps ends on every rank; rank 1 raises in the evaluation
  after it, before the all_gather_object that gathers the results.
"""
import sys

import torch.distributed as dist

sys.path.insert(0, __file__.rsplit("/", 2)[0] + "/bugs")
from _common import grads, init  # noqa: E402

mode = sys.argv[1]
rank, world = init()
steps = 20 if mode == "in_step" else 8
for step in range(1, steps + 1):
    if mode == "in_step" and rank == 1 and step == 12:
        raise RuntimeError(f"bad batch in step {step}")  # expect: raise
    g = grads()
    dist.all_reduce(g)
results = {"rank": rank}
if rank == 1:
    raise KeyError("accuracy")  # expect: raise_after
out = [None] * world
dist.all_gather_object(out, results)
dist.barrier()
