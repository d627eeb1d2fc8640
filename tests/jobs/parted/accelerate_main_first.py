"""Accelerate's `main_process_first()` around work that all-reduces on the main process.

The block runs on the main process first while the others wait in the context manager's
own barrier (its design), then on the others. Here the block calls a helper that
averages a statistic over ranks: the main process all-reduces alone while the others
wait in main_process_first's barrier. The designed barrier is not the fault: the
collective inside a block the main process runs first, alone, is. With `healthy`, the
block only prepares data (no collective): quiet. Modelled on public reports of
dataset preparation under main_process_first that synchronised inside. 2 ranks.
"""
import sys

import torch
import torch.distributed as dist
from accelerate import Accelerator

accelerator = Accelerator(cpu=True)
mode = sys.argv[1] if len(sys.argv) > 1 else "bug"


def vocab_stats(sizes):
    t = torch.tensor([float(sum(sizes))])
    if mode == "bug":
        dist.all_reduce(t)  # expect: parted
    return float(t.item())


dist.all_reduce(torch.ones(1))  # everyone is up
for _epoch in range(2):
    with accelerator.main_process_first():  # expect: designed
        stats = vocab_stats([3, 4, 5])
    dist.all_reduce(torch.ones(4))
accelerator.wait_for_everyone()
