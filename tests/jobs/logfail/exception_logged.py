"""A healthy gloo job (torchrun, 2 ranks) whose rank 0 fails to upload its metrics at step 3,
logs the exception with its traceback (`logger.exception`) and trains on to the end.

    torchrun --nproc-per-node 2 tests/jobs/logfail/exception_logged.py
"""

import datetime
import logging

import torch
import torch.distributed as dist

logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", level=logging.INFO)
log = logging.getLogger("trainer")


def upload(step: int) -> None:
    raise ConnectionError(f"metrics server 10.1.2.3:8086 refused the connection (step {step})")


dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=30))
rank = dist.get_rank()
for step in range(1, 9):
    t = torch.ones(2)
    dist.all_reduce(t)
    log.info("step %d | loss %.4f", step, 1.0 / step)
    if rank == 0 and step == 3:
        try:
            upload(step)
        except ConnectionError:
            log.exception("could not upload metrics; continuing")
log.info("training finished")
dist.destroy_process_group()
