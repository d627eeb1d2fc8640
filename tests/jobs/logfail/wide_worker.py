"""Failures no log family named before issue 35, recorded for real on CPU/gloo: torchelastic
restarts (`--max-restarts`), DDP's "marked as ready twice", a distributed checkpoint that
cannot be written, a torch.compile backend that raises. `record.py` runs them (its table:
scenarios_wide.py). By hand:

    torchrun --nproc-per-node 2 --max-restarts 1 tests/jobs/logfail/wide_worker.py restart_fails
"""

import argparse
import datetime
import os
import signal
import tempfile
import time

import torch
import torch.distributed as dist

TIMEOUT = datetime.timedelta(seconds=3)


def init() -> int:
    dist.init_process_group("gloo", timeout=TIMEOUT)
    return dist.get_rank()


def attempt() -> int:
    """Which start of the worker group this is (torchelastic counts restarts)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def restart_fails(args) -> None:
    """Rank `victim` fails the same way on every attempt: the group restarts, then gives up."""
    rank = init()
    dist.all_reduce(torch.ones(4))
    if rank == args.victim:
        raise OSError(f"shard {rank}: tokenized dataset file is truncated (attempt {attempt()})")
    time.sleep(6)


def restart_recovers(args) -> None:
    """Rank `victim` is SIGKILLed before it joins the group, on the first attempt only; the
    restarted group trains to the end."""
    if int(os.environ["RANK"]) == args.victim and attempt() == 0:
        time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGKILL)
    rank = init()
    for step in range(3):
        dist.all_reduce(torch.ones(8))
        if rank == 0:
            print(f"attempt {attempt()} step {step} done", flush=True)
    dist.barrier()
    if rank == 0:
        print("training done", flush=True)
    dist.destroy_process_group()


class Twice(torch.nn.Module):
    """One layer applied twice, each under a reentrant activation checkpoint."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint

        y = checkpoint(self.lin, x, use_reentrant=True)
        return checkpoint(self.lin, y, use_reentrant=True)


def ready_twice(args) -> None:
    """Two reentrant backward passes through the same parameters under DDP with
    find_unused_parameters=True: reducer.cpp's "marked as ready twice" on every rank."""
    init()
    model = torch.nn.parallel.DistributedDataParallel(Twice(), find_unused_parameters=True)
    x = torch.randn(4, 8, requires_grad=True)
    model(x).sum().backward()


def checkpoint_unwritable(args) -> None:
    """torch.distributed.checkpoint.save under a path whose parent is a file (permissions
    would not stop root): every rank gets the CheckpointException that gathers every rank's
    error."""
    import torch.distributed.checkpoint as dcp

    init()
    fd, blocker = tempfile.mkstemp(prefix="dcp-")
    os.close(fd)
    target = os.path.join(blocker, "ckpt")
    state = {"w": torch.ones(16) * dist.get_rank()}
    dcp.save(state, checkpoint_id=target)


def compile_backend_raises(args) -> None:
    """torch.compile with a backend that fails on rank `victim`: dynamo's
    BackendCompilerFailed, a name no log family knew."""
    rank = init()

    def backend(gm, example_inputs):
        if rank == args.victim:
            raise ValueError("graph has an op this backend cannot lower: aten.softmax")
        return gm.forward

    fn = torch.compile(lambda t: torch.softmax(t * 2, dim=0), backend=backend)
    dist.all_reduce(fn(torch.ones(4)))
    dist.barrier()


SCENARIOS = {f.__name__: f for f in (restart_fails, restart_recovers, ready_twice,
                                     checkpoint_unwritable, compile_backend_raises)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("scenario", choices=sorted(SCENARIOS))
    parser.add_argument("--victim", type=int, default=1)
    args = parser.parse_args()
    SCENARIOS[args.scenario](args)


if __name__ == "__main__":
    main()
