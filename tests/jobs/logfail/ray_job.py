"""Two Ray actors on CPU that form a gloo group, the way RL and serving stacks run torch on Ray
(one actor per rank). `kill`: rank 1's process is SIGKILLed mid-collective (the actor dies);
`raise`: rank 1 raises. The driver's output is the log (record.py: scenarios_wide.py).

    python tests/jobs/logfail/ray_job.py kill
"""

import os
import signal
import sys
import time

import ray
import torch
import torch.distributed as dist


@ray.remote(num_cpus=0)
class RayWorker:
    def setup(self, rank: int, world: int, port: int) -> str:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world)
        print(f"rank {rank} of {world} joined the group", flush=True)
        return f"{rank}:{os.getpid()}"

    def step(self, n: int, mode: str) -> float:
        rank = dist.get_rank()
        t = torch.ones(16)
        for i in range(n):
            if rank == 1 and i == 2:
                if mode == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                raise RuntimeError("reward model returned NaN for batch 2 (simulated)")
            dist.all_reduce(t)
            print(f"rank {rank} step {i}", flush=True)
            time.sleep(0.2)
        return float(t[0])


def main(mode: str) -> None:
    ray.init(num_cpus=2, include_dashboard=False)
    workers = [RayWorker.remote() for _ in range(2)]
    port = 29500 + os.getpid() % 1000
    print(ray.get([w.setup.remote(r, 2, port) for r, w in enumerate(workers)]), flush=True)
    print(ray.get([w.step.remote(5, mode) for w in workers]))


if __name__ == "__main__":
    main(sys.argv[1])
