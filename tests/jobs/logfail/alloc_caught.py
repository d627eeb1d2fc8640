"""A gloo job (torchrun, 2 ranks) whose rank 1 fails to allocate host memory at step 3,
catches it as fairseq's trainer catches an OOM ("OOM: ran out of memory with exception:
...", "attempting to recover from OOM"), skips the batch and trains on to the end. With
--uncaught the same failure is not caught: rank 1 dies of it.

    torchrun --nproc-per-node 2 tests/jobs/logfail/alloc_caught.py [--uncaught]
"""

import datetime
import logging
import sys

import torch
import torch.distributed as dist

CAUGHT = KeyError if "--uncaught" in sys.argv else RuntimeError  # (KeyError: nothing caught)

logging.basicConfig(format="%(asctime)s | %(levelname)s | trainer | %(message)s",
                    level=logging.INFO)
log = logging.getLogger()
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
rank = dist.get_rank()
w = torch.zeros(4)
for step in range(1, 9):
    try:
        if rank == 1 and step == 3:
            torch.empty(2**48, dtype=torch.float32)  # 1 PiB: more than any host has
        g = torch.ones(4) * (rank + 1)
    except CAUGHT as e:
        log.warning("OOM: ran out of memory with exception: %s", e)
        log.warning("attempting to recover from OOM; skipping batch")
        g = torch.zeros(4)
    dist.all_reduce(g)
    w -= 0.01 * g
    log.info("step %d | loss %.4f", step, float(w.sum()))
log.info("training finished")
dist.destroy_process_group()
