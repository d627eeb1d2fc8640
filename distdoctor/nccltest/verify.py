"""Deterministic inputs per rank, the results an op must produce, and wrong-element counts.

Every element is a function of (rank, absolute element index, seed), so any rank can
compute any other rank's input, and therefore the exact expected output, without talking
to it. Values stay small integers so sums and products are exact in every dtype:
sum/avg inputs lie in [0, K] with n*K inside the dtype's exact-integer range where
possible; prod inputs are 1 or 2; max/min and data-movement inputs lie in [0, 99].
Integer overflow wraps the same way in the collective and here, so it stays exact.
Work is done in blocks so the temporaries stay bounded at large sizes.
"""

from __future__ import annotations

import torch

from distdoctor.nccltest.options import DTYPES, FLOAT_TYPES

BLOCK = 1 << 22  # elements per block of generated data (32 MiB of int64 temporaries)
_EXACT_INT = {"half": 2048, "bfloat16": 256, "float": 1 << 24, "double": 1 << 53}


def torch_dtype(name: str) -> torch.dtype:
    return getattr(torch, DTYPES[name][0])


def sum_range(dtype_name: str, nranks: int) -> int:
    """K: sum/avg inputs lie in [0, K] so that a sum over n ranks stays exact."""
    limit = _EXACT_INT.get(dtype_name)
    if limit is None:  # integers wrap identically everywhere
        return 3
    return max(1, min(3, limit // max(nranks, 1)))


def _mixed(rank: int, start: int, count: int, seed: int, device) -> torch.Tensor:
    """Non-negative pseudo-random int64 per absolute index (a small integer hash)."""
    x = torch.arange(start, start + count, dtype=torch.int64, device=device)
    x = x * 2654435761 + (rank * 40503 + seed * 9176 + 12345)
    x = x ^ (x >> 15)
    x = x * 2246822519
    x = x ^ (x >> 13)
    return x & 0x7FFFFFFF


def _values(kind: str, rank: int, start: int, count: int, nranks: int, dtype_name: str,
            seed: int, device) -> torch.Tensor:
    x = _mixed(rank, start, count, seed, device)
    if kind in ("sum", "avg"):
        return x % (sum_range(dtype_name, nranks) + 1)
    if kind == "prod":
        return 1 + (x % 4 == 0).to(torch.int64)
    return x % 100  # max, min, and plain data for ops that only move it


def fill(target: torch.Tensor, kind: str, rank: int, start: int, nranks: int,
         dtype_name: str, seed: int) -> None:
    """Write rank `rank`'s input for elements [start, start + len(target)) into `target`.

    `kind` is the reduction op for reducing collectives, else "data".
    """
    count = target.numel()
    for lo in range(0, count, BLOCK):
        hi = min(count, lo + BLOCK)
        vals = _values(kind, rank, start + lo, hi - lo, nranks, dtype_name, seed, target.device)
        target[lo:hi].copy_(vals)


def fill_reduced(target: torch.Tensor, redop: str, nranks: int, start: int,
                 dtype_name: str, seed: int) -> None:
    """Write the reduction over all ranks' inputs, elements [start, start + len(target))."""
    floating = dtype_name in FLOAT_TYPES
    acc_dtype = torch.float64 if floating else torch_dtype(dtype_name)
    count = target.numel()
    for lo in range(0, count, BLOCK):
        hi = min(count, lo + BLOCK)
        acc = None
        for r in range(nranks):
            v = _values(redop, r, start + lo, hi - lo, nranks, dtype_name, seed,
                        target.device).to(acc_dtype)
            if acc is None:
                acc = v
            elif redop in ("sum", "avg"):
                acc.add_(v)
            elif redop == "prod":
                acc.mul_(v)
            elif redop == "max":
                acc = torch.maximum(acc, v)
            else:
                acc = torch.minimum(acc, v)
        if redop == "avg":
            acc = acc / nranks if floating else torch.div(acc, nranks, rounding_mode="trunc")
        target[lo:hi].copy_(acc)


def tolerance(redop: str, dtype_name: str, nranks: int) -> tuple[float, float]:
    """(rtol, atol) for comparing a result; (0, 0) means bit-exact."""
    if dtype_name not in FLOAT_TYPES:
        return (0.0, 1.0) if redop == "avg" else (0.0, 0.0)
    eps = torch.finfo(torch_dtype(dtype_name)).eps
    if redop == "avg":  # sum then divide, or divide then sum: rounding differs
        return 4 * eps, eps
    if redop == "sum" and nranks * sum_range(dtype_name, nranks) > _EXACT_INT[dtype_name]:
        return nranks * eps, 0.0  # beyond exact integers the summation order shows
    return 0.0, 0.0


def count_wrong(result: torch.Tensor, expected: torch.Tensor,
                rtol: float = 0.0, atol: float = 0.0) -> int:
    """How many elements of `result` differ from `expected` (beyond the tolerance)."""
    if result.numel() != expected.numel():
        raise ValueError(f"result has {result.numel()} elements, expected {expected.numel()}")
    if rtol == 0.0 and atol == 0.0:
        return int((result != expected).sum().item())
    wrong = 0
    for lo in range(0, result.numel(), BLOCK):
        hi = min(result.numel(), lo + BLOCK)
        close = torch.isclose(result[lo:hi].double(), expected[lo:hi].double(),
                              rtol=rtol, atol=atol)
        wrong += int((~close).sum().item())
    return wrong
