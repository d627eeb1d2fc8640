"""A gloo job whose ranks are Slurm tasks (srun -n N, one task per rank), for the Slurm
fixtures in tests/fixtures/logs/real/ (see its README for the srun/sbatch lines).

    srun -l -n 2 python tests/jobs/logfail/slurm_job.py raise
"""

import datetime
import os
import signal
import sys
import time

import torch
import torch.distributed as dist


def main(mode: str) -> None:
    rank, world = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(20000 + int(os.environ["SLURM_JOB_ID"]) % 20000))
    dist.init_process_group("gloo", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=3))
    for step in range(100 if mode == "train" else 5):
        if rank == 1 and step == 2:
            if mode == "raise":
                raise ValueError("label 7 out of range for 5 classes (simulated)")
            if mode == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
        dist.all_reduce(torch.ones(8))
        print(f"rank {rank} step {step}", flush=True)
        time.sleep(0.5 if mode == "train" else 0.2)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
