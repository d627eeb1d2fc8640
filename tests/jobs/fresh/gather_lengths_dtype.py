"""Padding to the longest length: each rank all-reduces its length (int64, MAX), then
allocates a buffer of the longest. From step 2 rank 1 takes its length from a float64
statistic (same numel, same bytes, so gloo does not notice); rank 0 reads those float
bits as an int64 length and its CPU allocation of that size fails ("can't allocate
memory: you tried to allocate ... bytes") just after the all_reduce completed: the
mismatch's consequence, not host memory exhausted. With `overflow`, a buffer of that
many rows of 1024 fails its storage size check instead: likewise a consequence, not an
error of rank 0's program. 2 ranks."""
import sys

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    for step in range(4):
        n = 3 + rank
        length = torch.tensor([n], dtype=torch.float64 if rank == 1 and step >= 2 else None)
        dist.all_reduce(length, op=dist.ReduceOp.MAX)  # expect: op
        longest = int(length.item())
        shape = (longest, 1024) if sys.argv[1:] == ["overflow"] else (longest,)
        buf = torch.empty(shape, dtype=torch.uint8)  # expect: alloc
        dist.all_reduce(buf[:1].zero_())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
