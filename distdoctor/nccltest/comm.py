"""Small collective helpers for the harness's own bookkeeping (never inside a timed loop).

They use plain tensors on the rank's device so they work on every backend (NCCL needs CUDA
tensors), and JSON rather than pickle to share rank facts.
"""

from __future__ import annotations

import json

import torch
import torch.distributed as dist


def device_sync(device: torch.device) -> None:
    """Block the host until the device has finished (a no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def complete(works: list, device: torch.device) -> None:
    """Wait for every Work handle, then for the device: the op's data is in place."""
    for work in works:
        if work is not None:
            work.wait()
    device_sync(device)


def barrier(device: torch.device, group=None) -> None:
    """A barrier as a one-element all_reduce: quiet and identical on every backend."""
    flag = torch.zeros(1, device=device)
    dist.all_reduce(flag, group=group)
    device_sync(device)


def gather_floats(values: list[float], device: torch.device) -> list[list[float]]:
    """Every rank's `values` (same length everywhere), indexed by global rank."""
    world, rank = dist.get_world_size(), dist.get_rank()
    table = torch.zeros(world, len(values), dtype=torch.float64, device=device)
    table[rank] = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(table)
    return table.cpu().tolist()


def any_rank(flag: bool, device: torch.device) -> bool:
    """True on every rank when `flag` is true on at least one."""
    t = torch.tensor([1.0 if flag else 0.0], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item() > 0)


def gather_json(obj, device: torch.device) -> list:
    """Every rank's JSON-able `obj`, indexed by global rank."""
    data = json.dumps(obj).encode()
    world, rank = dist.get_world_size(), dist.get_rank()
    lengths = torch.zeros(world, dtype=torch.int64, device=device)
    lengths[rank] = len(data)
    dist.all_reduce(lengths)
    width = int(lengths.max().item())
    table = torch.zeros(world, width, dtype=torch.uint8, device=device)
    table[rank, :len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device)
    dist.all_reduce(table)  # each row is written by one rank, so the sum is a gather
    rows = table.cpu()
    return [json.loads(bytes(rows[r, :int(lengths[r])].tolist()).decode()) for r in range(world)]
