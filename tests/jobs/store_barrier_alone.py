"""One rank of a world of 2 in c10d's store-based barrier, the other never arriving: torch's
own `_store_based_barrier` (what init_process_group/new_group run with TORCH_DIST_INIT_BARRIER=1)
logs its waits every 10 s, then raises at its timeout. Usage: store_barrier_alone.py TIMEOUT_S"""

import logging
import sys
from datetime import timedelta

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

logging.basicConfig(level=logging.DEBUG, format="[%(asctime)s] %(levelname)s %(name)s: %(message)s")
logging.getLogger("torch.distributed.distributed_c10d").setLevel(logging.DEBUG)
store = dist.HashStore()
c10d._store_based_barrier(0, store, "1", 2, timedelta(seconds=float(sys.argv[1])))
