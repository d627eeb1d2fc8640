"""A worker of a two-node job (gloo) whose global rank 2 raises at step 3. Run as two
torchrun agents on one machine, one per "node", with a c10d rendezvous; each agent's output
in its own file (the log of a node whose own workers did not fail):

    torchrun --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d \\
        --rdzv-endpoint 127.0.0.1:PORT --rdzv-id job7 other_node_raises.py > nodeA.log 2>&1 &
    torchrun ... (the same) > nodeB.log 2>&1 &
"""

import datetime
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank = dist.get_rank()
for step in range(1, 5):
    if rank == 2 and step == 3:
        raise RuntimeError("NaN detected in gradients of layer 'blocks.7.attn' (step 3)")
    t = torch.ones(2)
    dist.all_reduce(t)
    print(f"step {step} loss {1.0 / step:.3f}", flush=True)
    time.sleep(0.5)
