"""A barrier inside an exception handler: the rank whose record fails to parse syncs
"before skipping" while the other goes on to the step's all_reduce. Rank 1 raises, at
step 3. 2 ranks: no majority, the handler tells who strayed."""
import torch
import torch.distributed as dist


def parse(rank, step):
    if rank == 1 and step == 3:
        raise ValueError("bad record")
    return torch.ones(4) * step


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    for step in range(6):
        try:  # expect: branch
            x = parse(rank, step)
        except ValueError:
            dist.barrier()  # expect: op
            continue
        dist.all_reduce(x)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
