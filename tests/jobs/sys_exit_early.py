"""A rank that calls sys.exit in the middle of training: its data helper finds its shard
used up at step EXIT_AT and exits, while the others go on to the next step's all-reduce
and wait for it. ARGV[1]: the status rank 1 exits with (0: "done", not an error to it),
or "raise": it raises ValueError there instead.
Before training, every rank parses its options in a way that raises SystemExit and
catches it (as a CLI's --help handling can): an exit that did not end the process.

Launched per rank (`distdoctor run --nproc 2`, torchrun), or with `--spawn` as 2 ranks
of torch.multiprocessing.spawn, whose child catches the SystemExit and calls sys.exit
again with its code."""

import os
import sys

import torch
import torch.distributed as dist

EXIT_AT, STEPS = 5, 10
STATUS = sys.argv[1]


def parse_options():
    try:
        sys.exit(2)  # caught: the job goes on
    except SystemExit:
        return {"steps": STEPS}


def next_batch(step):
    if dist.get_rank() == 1 and step == EXIT_AT:
        print(f"rank 1 leaves at step {step}", flush=True)
        if STATUS == "raise":
            raise ValueError(f"shard 1 has no batch {step}")  # expect: raise
        sys.exit(int(STATUS))  # expect: exit
    return torch.randn(4)


def train(options):
    weight = torch.zeros(4, requires_grad=True)
    opt = torch.optim.SGD([weight], lr=0.1)
    for step in range(options["steps"]):
        loss = (weight * next_batch(step)).sum()
        loss.backward()
        dist.all_reduce(weight.grad)  # expect: wait
        opt.step()
        opt.zero_grad()
    dist.destroy_process_group()


def spawned(rank, world, port):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    train(parse_options())


if __name__ == "__main__":
    if "--spawn" in sys.argv:
        import torch.multiprocessing as mp

        mp.spawn(spawned, args=(2, int(os.environ.get("SPAWN_PORT", "29531"))), nprocs=2)
    else:
        options = parse_options()
        dist.init_process_group("gloo")
        train(options)
