"""A 2-rank gloo job whose own heartbeat thread keeps logging while it hangs: rank 1 stops
feeding after step 3 (as a stuck data loader would) and rank 0 waits in the next all_reduce,
its heartbeat saying the same step every 0.3 s. Run under torchrun --tee 3; the caller kills
it while it hangs and reads what it printed (tests/test_logs_repeats.py)."""

import logging
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
log = logging.getLogger("train")
dist.init_process_group("gloo", timeout=timedelta(seconds=120))
rank = dist.get_rank()
step = 0


def heartbeat() -> None:
    while True:
        time.sleep(0.3)
        logging.getLogger("heartbeat").info("rank %d alive, still at step %d, waiting in all_reduce",
                                            rank, step)


for step in range(1, 6):
    if rank == 1 and step == 4:
        time.sleep(3600)  # stuck fetching the next batch
    t = torch.ones(4) * step
    if step == 4:
        threading.Thread(target=heartbeat, daemon=True).start()
    dist.all_reduce(t)
    log.info("step %d loss %.3f", step, 2.0 / step)
