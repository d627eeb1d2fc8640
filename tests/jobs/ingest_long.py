"""A loop of one all-reduce per iteration, long enough that every per-step table of the
straggler accounting passes its bound (test_native_ingest): the rank's steps (KEEP), the
lateness window and its history (STEPS, LONG_STEPS), the wait-for graph's steps, each
table dropping its oldest while it grows and packs."""
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
x = torch.ones(4)
for _ in range(1400):
    dist.all_reduce(x)
dist.destroy_process_group()
