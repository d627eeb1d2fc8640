"""A 3-stage pipeline where the last stage receives from src=0 (stage 1's code copied)
instead of from stage 1, which feeds it: rank 2 waits for rank 0, which never exchanges
with it, while rank 1 waits to send to rank 2. Rank 2's op names the wrong peer; rank 0,
which "posted no matching send", did nothing wrong. 3 ranks."""
import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    for _ in range(3):
        x = torch.ones(16)
        if rank == 0:
            dist.send(x, dst=1)
        elif rank == 1:
            dist.recv(x, src=0)
            dist.send(x * 2, dst=2)  # expect: feeder
        else:
            dist.recv(x, src=0)  # expect: op
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
