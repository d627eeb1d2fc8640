"""--pairwise: send/recv bandwidth of every ordered pair of ranks, and ping-pong latency.

Pairs run one at a time while there are at most 64 of them (nothing else shares the links),
else in rounds of disjoint pairs (the circle method: n-1 rounds). Within a pair: a
handshake, `-w` untimed transfers, then `-n` transfers of `-e` bytes issued back to back
one way, timed on the receiver, then the other way; then `-n` round trips of 8 bytes
(latency = round trip / 2). A barrier separates rounds. Each entry of the matrices is
written by one rank, so one all_reduce gives every rank both matrices.

Test-only hook: DISTDOCTOR_TEST_SEND_DELAY_MS="rank:ms[,rank:ms]" makes those ranks sleep
before each pairwise send, to stand in for a slow link in tests. Nothing else reads it.
"""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

from distdoctor.errors import UserError
from distdoctor.nccltest import comm

DELAY_ENV = "DISTDOCTOR_TEST_SEND_DELAY_MS"
SERIAL_MAX_PAIRS = 64
LATENCY_BYTES = 8


def send_delays(text: str | None) -> dict[int, float]:
    """'2:30,5:10' -> {2: 0.030, 5: 0.010} seconds of sleep before each send."""
    out: dict[int, float] = {}
    for part in (text or "").split(","):
        if not part.strip():
            continue
        try:
            rank, ms = part.split(":")
            out[int(rank)] = float(ms) / 1000.0
        except ValueError:
            raise UserError(f"{DELAY_ENV}={text!r}: use rank:ms[,rank:ms]", 2) from None
    return out


def schedule(n: int, serial: bool) -> list[list[tuple[int, int]]]:
    """Rounds of disjoint pairs (a < b) covering every pair once."""
    if serial:
        return [[(a, b)] for a in range(n) for b in range(a + 1, n)]
    players: list[int | None] = [*range(n)] + ([None] if n % 2 else [])
    m = len(players)
    rounds = []
    for _ in range(m - 1):
        pairs = [(players[i], players[m - 1 - i]) for i in range(m // 2)]
        rounds.append([(min(a, b), max(a, b)) for a, b in pairs
                       if a is not None and b is not None])
        players = [players[0], players[-1], *players[1:-1]]
    return rounds


def _handshake(rank: int, peer: int, tiny: torch.Tensor) -> None:
    """A blocking exchange so both sides start the timed part together."""
    if rank < peer:
        dist.send(tiny, peer)
        dist.recv(tiny, peer)
    else:
        dist.recv(tiny, peer)
        dist.send(tiny, peer)
    comm.device_sync(tiny.device)


def _stream(rank: int, src: int, dst: int, buf: torch.Tensor, iters: int, warmup: int,
            delay: float, tiny: torch.Tensor) -> float:
    """Seconds for `iters` back-to-back transfers src -> dst (meaningful on dst)."""
    peer = dst if rank == src else src
    for count, timed in ((warmup, False), (iters, True)):
        if timed:
            _handshake(rank, peer, tiny)
        start = time.perf_counter()
        works = []
        for _ in range(count):
            if rank == src:
                if timed and delay:
                    time.sleep(delay)
                works.append(dist.isend(buf, dst))
            else:
                works.append(dist.irecv(buf, src))
        comm.complete(works, buf.device)
    return time.perf_counter() - start


def _ping_pong(rank: int, a: int, b: int, small: torch.Tensor, iters: int,
               delay: float) -> float:
    """Mean one-way latency in seconds over `iters` round trips a -> b -> a."""
    peer = b if rank == a else a
    _handshake(rank, peer, small)
    start = time.perf_counter()
    for _ in range(iters):
        if rank == a:
            if delay:
                time.sleep(delay)
            dist.send(small, b)
            dist.recv(small, b)
        else:
            dist.recv(small, a)
            if delay:
                time.sleep(delay)
            dist.send(small, a)
    comm.device_sync(small.device)
    return (time.perf_counter() - start) / iters / 2


def measure(device: torch.device, nbytes: int, iters: int, warmup: int,
            delays: dict[int, float], only: list[tuple[int, int]] | None = None,
            ) -> tuple[list[list[float]], list[list[float]]]:
    """(bandwidth GB/s [src][dst], latency us [a][b]); the same on every rank. `only`
    (pairs a < b, the same list on every rank) measures just those, one at a time; the
    other entries stay 0."""
    rank, n = dist.get_rank(), dist.get_world_size()
    count = max(1, nbytes // 4)
    buf = torch.zeros(count, dtype=torch.float32, device=device)
    small = torch.zeros(LATENCY_BYTES // 4, dtype=torch.float32, device=device)
    bw = torch.zeros(n, n, dtype=torch.float64, device=device)
    lat = torch.zeros(n, n, dtype=torch.float64, device=device)
    delay = delays.get(rank, 0.0)
    rounds = ([[pair] for pair in only] if only is not None
              else schedule(n, n * (n - 1) // 2 <= SERIAL_MAX_PAIRS))
    for round_ in rounds:
        for a, b in round_:
            if rank not in (a, b):
                continue
            for src, dst in ((a, b), (b, a)):
                seconds = _stream(rank, src, dst, buf, iters, warmup, delay if rank == src
                                  else 0.0, small)
                if rank == dst:
                    bw[src, dst] = count * 4 * iters / 1e9 / seconds
            one_way = _ping_pong(rank, a, b, small, iters, delay)
            if rank == a:
                lat[a, b] = lat[b, a] = one_way * 1e6
        comm.barrier(device)
    dist.all_reduce(bw)
    dist.all_reduce(lat)
    return bw.cpu().tolist(), lat.cpu().tolist()


def delays_from_env() -> dict[int, float]:
    return send_delays(os.environ.get(DELAY_ENV))
