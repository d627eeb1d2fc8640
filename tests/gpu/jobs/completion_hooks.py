"""A Python on-completion hook on an NCCL group (torch's `_register_on_completion_hook`),
slower than the ops it follows; the group is destroyed right after the last op. torch's
destroy_process_group waits for the Works whose hooks are still to run (a hook run once
the interpreter is gone crashes taking the GIL), so every hook has run when it returns:
the job prints how many ran then. Unmodified script, for `distdoctor run` and bare alike.

    distdoctor run --nproc 1 -- tests/gpu/jobs/completion_hooks.py [OPS]
"""

import json
import os
import sys
import threading
import time

import torch
import torch.distributed as dist

OPS = int(sys.argv[1]) if len(sys.argv) > 1 else 20
device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
torch.cuda.set_device(device)
dist.init_process_group("nccl", device_id=device)
ran = []
lock = threading.Lock()


def hook(info):
    time.sleep(0.02)  # slower than the ops: some are still to run at destroy
    with lock:
        ran.append(info.op_type)


dist.group.WORLD._register_on_completion_hook(hook)
t = torch.ones(1 << 20, device=device)
for _ in range(OPS):
    dist.all_reduce(t)
torch.cuda.synchronize()
dist.destroy_process_group()
with lock:
    print("HOOKS " + json.dumps({"ran": len(ran), "ops": OPS}), flush=True)
