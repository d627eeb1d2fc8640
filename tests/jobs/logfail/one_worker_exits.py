"""Worker 1 of 3 exits with status 3 while the others wait in a barrier: torchrun's agent then
sends the survivors SIGTERM ("Sending process N closing signal SIGTERM") before its
ChildFailedError table. Run by tests/test_logs_round_four.py with the workers' own output
redirected (-r 3), as a console that shows only the agent's lines."""

import sys
import time

import torch.distributed as dist

dist.init_process_group("gloo")
if dist.get_rank() == 1:
    time.sleep(1)
    sys.exit(3)
dist.barrier()
