"""One all_reduce line in a `for step in range(...)` loop: rank 1 sends float16 from
step 2 on (autocast left on), the other float32 ("same op, another dtype"); or, with
`op`, rank 0 reduces with MAX where the other sums from the start. The loop walks the
same steps on every rank: the order of its collectives is not the story. 2 ranks."""
import sys

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    by_op = sys.argv[1:] == ["op"]
    for step in range(4):
        grad = torch.ones(64)
        if rank == 1 and step >= 2 and not by_op:
            grad = grad.half()
        op = dist.ReduceOp.MAX if rank == 0 and by_op else dist.ReduceOp.SUM
        dist.all_reduce(grad, op=op)  # expect: op
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
