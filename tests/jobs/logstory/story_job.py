"""A small gloo job that fails at a chosen point of its story, for the log-story tests.

  --fault sibling-killed  every rank trains; rank 1 kills itself with SIGKILL after step 3
                          (rank 0 then loses its peer inside the next all_reduce)
  --fault store-never-fills  the ranks join a process group of one rank more than were
                          launched: the store never fills; a faulthandler dump after 1.5 s
                          (rank r's at 1.5 + r s) shows where they stood, then the test
                          stops the launcher (SIGTERM); with --dump-on usr1 a rank dumps
                          when sent SIGUSR1 instead (torn_dumps.py: every rank at once),
                          with --dump-on abort when it aborts (SIGABRT)
Run under torchrun (its environment contract: RANK, WORLD_SIZE, MASTER_ADDR/PORT).
"""

import argparse
import faulthandler
import os
import signal
import sys
from datetime import timedelta

import torch
import torch.distributed as dist


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--fault", required=True, choices=("sibling-killed", "store-never-fills"))
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--dump-on", choices=("timer", "usr1", "abort"), default="timer")
    args = ap.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if args.fault == "store-never-fills":
        # the timer: one rank's dump after the other's, each whole; dumps written at once
        # tear each other's lines in the combined log (what torn_dumps.py makes happen)
        if args.dump_on == "usr1":
            faulthandler.register(signal.SIGUSR1)
        elif args.dump_on == "abort":  # a fatal signal: "Fatal Python error: Aborted"
            faulthandler.enable()
        else:
            faulthandler.dump_traceback_later(1.5 + rank, exit=False)
        print(f"rank {rank}: init_process_group (world {world + 1})", flush=True)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}",
                                rank=rank, world_size=world + 1, timeout=timedelta(seconds=60))
        return
    dist.init_process_group("gloo", timeout=timedelta(seconds=30))
    w = torch.ones(8)
    for step in range(1, 7):
        dist.all_reduce(w)
        w /= world
        print(f"step {step} | loss {1.0 / step:.4f} | lr 1.0e-03", flush=True)
        if rank == 1 and step == 3:
            os.kill(os.getpid(), signal.SIGKILL)
    dist.destroy_process_group()
    print("Training completed.", flush=True)


if __name__ == "__main__":
    sys.exit(main())
