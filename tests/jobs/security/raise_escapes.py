"""Rank 1 raises an exception whose message holds terminal escape codes and rich markup
(a hostile or merely careless message: a file name, a tokenizer's byte, a user string)."""

import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(4)
dist.all_reduce(t)
if rank == 1:
    raise RuntimeError("bad batch \x1b[2J\x1b]0;owned\x07 [/x] [bold]shard[/bold] \x9b31m")
dist.all_reduce(t)  # rank 0 waits here for rank 1, which is gone
dist.destroy_process_group()
os._exit(0)
