"""What the ranks test together: an all-reduce whose answer is known, the clock offsets
between ranks, and the pairwise bandwidth sweep of `nccl-test --pairwise`."""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

from distdoctor.nccltest import comm, pairwise

ELEMENTS = 1 << 18  # 1 MiB of float32 in the correctness all-reduce
CLOCK_ROUNDS = 7
SWEEP_BYTES = 1 << 22  # 4 MiB per transfer: seconds for 8 ranks on loopback gloo
SWEEP_ITERS, SWEEP_WARMUP, SWEEP_ROUNDS = 4, 2, 3
# Re-measurements of a pair found slow before it is called slow. 4 ranks on this 2-core
# VM: 1 healthy measurement in 7 fell below half the median, and 3 sweeps alone warned
# in about 1 check in 25 (resampled from 90 real sweeps); with 4 more, 1 in 2500.
CONFIRM_ROUNDS = 4
SLOW_PAIR = 0.5  # of the median directed pair's bandwidth


def all_reduce_check(device: torch.device) -> dict:
    """Each rank sends rank+1 in every element (and its rank in a second tensor's slot):
    the sum is known everywhere. Returns this rank's view: whether its result was right,
    and the worst element's error."""
    rank, n = dist.get_rank(), dist.get_world_size()
    x = torch.full((ELEMENTS,), float(rank + 1), dtype=torch.float32, device=device)
    dist.all_reduce(x)
    want = n * (n + 1) / 2
    err = float((x - want).abs().max().item())
    seen = torch.zeros(n, dtype=torch.float32, device=device)
    seen[rank] = 1.0
    dist.all_reduce(seen)
    return {"ok": err == 0.0 and bool((seen == 1.0).all().item()), "max_error": err,
            "expected": want}


def clock_offsets(device: torch.device) -> list[float]:
    """Each rank's wall clock minus rank 0's, in seconds: every round all ranks leave a
    barrier together and read their clocks; the median over rounds (a rank descheduled
    once does not count)."""
    rounds = []
    for _ in range(CLOCK_ROUNDS):
        comm.barrier(device)
        rounds.append(comm.gather_floats([time.time()], device))
    n = len(rounds[0])
    return [statistics.median(r[i][0] - r[0][0] for r in rounds) for i in range(n)]


def sweep(device: torch.device) -> tuple[list[list[float]], list[list[float]]]:
    """(GB/s [src][dst], latency us [a][b]) of every pair (pairwise.measure), the best of
    SWEEP_ROUNDS sweeps, then of up to CONFIRM_ROUNDS re-measurements of each pair still
    below SLOW_PAIR of the median: a rank descheduled once (more ranks than cores, a daemon
    waking) slows some measurements, a slow link slows them all."""
    delays = pairwise.delays_from_env()

    def measure(only=None):
        return pairwise.measure(device, SWEEP_BYTES, SWEEP_ITERS, SWEEP_WARMUP, delays, only)

    best_bw, best_lat = measure()
    for _ in range(SWEEP_ROUNDS - 1):
        best_bw, best_lat = _best(best_bw, best_lat, *measure())
    for _ in range(CONFIRM_ROUNDS):
        pairs = slow_pairs(best_bw)
        if not pairs:
            break
        best_bw, best_lat = _best(best_bw, best_lat, *measure(pairs))
    return best_bw, best_lat


def slow_pairs(bw: list[list[float]]) -> list[tuple[int, int]]:
    """The pairs (a < b) with a direction below SLOW_PAIR of the median directed pair, in
    order: every rank holds the same matrix, so every rank gets the same list."""
    n = len(bw)
    directed = [bw[s][d] for s in range(n) for d in range(n) if s != d]
    if not directed:
        return []
    floor = SLOW_PAIR * statistics.median(directed)
    return [(a, b) for a in range(n) for b in range(a + 1, n)
            if min(bw[a][b], bw[b][a]) < floor]


def _best(bw, lat, new_bw, new_lat):
    """The higher bandwidth and the lower latency of each entry (0 = not measured)."""
    bw = [[max(a, b) for a, b in zip(x, y, strict=True)] for x, y in zip(bw, new_bw, strict=True)]
    lat = [[min(a, b) if b else a for a, b in zip(x, y, strict=True)]
           for x, y in zip(lat, new_lat, strict=True)]
    return bw, lat
