"""Buffers and the torch.distributed call of each op, out of place ("oop") or in place ("ip").

In-place layouts follow nccl-tests: all_gather/gather send from this rank's chunk of the
receive buffer, reduce_scatter/scatter receive into it. `build` returns a `Prepared`:
`init(seed)` writes this rank's inputs (and zeroes outputs), `issue()` starts the op
asynchronously and returns its Work handles, `result` is what this rank checks (None where
the op leaves nothing here, e.g. non-root ranks of reduce), and `expect(seed)` returns the
values `result` must then hold.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from distdoctor.nccltest.ops import Layout
from distdoctor.nccltest.verify import fill, fill_reduced, torch_dtype

REDUCE_OPS = {"sum": "SUM", "prod": "PRODUCT", "max": "MAX", "min": "MIN", "avg": "AVG"}

# torch 2.13 renamed the tensor forms; keep working on older releases (pyproject: >=2.6).
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


@dataclass
class Call:
    """One op at one size on this rank, in one place."""

    op: str
    place: str  # "oop" or "ip"
    lay: Layout
    dtype: str
    redop: str  # "none" for ops without a reduction
    root: int  # rank within the group, -1 where the op has no root
    rank: int  # this rank within the group
    group: Any  # ProcessGroup, or None for the default group
    global_ranks: list[int]  # group rank -> global rank
    device: torch.device


@dataclass
class Prepared:
    init: Callable[[int], None]
    issue: Callable[[], list]
    result: torch.Tensor | None
    expect: Callable[[int], torch.Tensor] | None


def _empty(count: int, call: Call) -> torch.Tensor:
    return torch.empty(count, dtype=torch_dtype(call.dtype), device=call.device)


def _chunks(buf: torch.Tensor, n: int) -> list[torch.Tensor]:
    return list(buf.split(buf.numel() // n)) if n else []


def _redop(call: Call):
    return getattr(dist.ReduceOp, REDUCE_OPS[call.redop])


def _data_expect(call: Call, parts: list[tuple[int, int, int]]) -> Callable[[int], Any]:
    """Expected buffer made of pieces (source rank, start element, count) of plain data."""
    total = sum(count for _, _, count in parts)

    def expect(seed: int) -> torch.Tensor:
        out, at = _empty(total, call), 0
        for src, start, count in parts:
            fill(out[at:at + count], "data", src, start, call.lay.nranks, call.dtype, seed)
            at += count
        return out
    return expect


def _reduced_expect(call: Call, start: int, count: int) -> Callable[[int], Any]:
    def expect(seed: int) -> torch.Tensor:
        out = _empty(count, call)
        fill_reduced(out, call.redop, call.lay.nranks, start, call.dtype, seed)
        return out
    return expect


def _all_reduce(call: Call) -> Prepared:
    buf, c, n = _empty(call.lay.count, call), call.lay.count, call.lay.nranks
    op, g = _redop(call), call.group
    return Prepared(
        init=lambda seed: fill(buf, call.redop, call.rank, 0, n, call.dtype, seed),
        issue=lambda: [dist.all_reduce(buf, op=op, group=g, async_op=True)],
        result=buf, expect=_reduced_expect(call, 0, c))


def _all_gather(call: Call) -> Prepared:
    c, n, r, g = call.lay.count, call.lay.nranks, call.rank, call.group
    recv = _empty(c * n, call)
    send = recv[r * c:(r + 1) * c] if call.place == "ip" else _empty(c, call)

    def init(seed: int) -> None:
        recv.zero_()
        fill(send, "data", r, 0, n, call.dtype, seed)
    return Prepared(init, lambda: [_ALL_GATHER(recv, send, group=g, async_op=True)], recv,
                    _data_expect(call, [(s, 0, c) for s in range(n)]))


def _reduce_scatter(call: Call) -> Prepared:
    c, n, r, g, op = call.lay.count, call.lay.nranks, call.rank, call.group, _redop(call)
    send = _empty(c * n, call)
    recv = send[r * c:(r + 1) * c] if call.place == "ip" else _empty(c, call)

    def init(seed: int) -> None:
        if call.place == "oop":
            recv.zero_()
        fill(send, call.redop, r, 0, n, call.dtype, seed)
    return Prepared(init, lambda: [_REDUCE_SCATTER(recv, send, op=op, group=g, async_op=True)],
                    recv, _reduced_expect(call, r * c, c))


def _broadcast(call: Call) -> Prepared:
    c, n, r, g = call.lay.count, call.lay.nranks, call.rank, call.group
    buf, src = _empty(c, call), call.global_ranks[call.root]

    def init(seed: int) -> None:
        if r == call.root:
            fill(buf, "data", r, 0, n, call.dtype, seed)
        else:
            buf.zero_()
    return Prepared(init, lambda: [dist.broadcast(buf, src=src, group=g, async_op=True)], buf,
                    _data_expect(call, [(call.root, 0, c)]))


def _reduce(call: Call) -> Prepared:
    c, n, r, g, op = call.lay.count, call.lay.nranks, call.rank, call.group, _redop(call)
    buf, dst = _empty(c, call), call.global_ranks[call.root]
    at_root = r == call.root
    return Prepared(
        init=lambda seed: fill(buf, call.redop, r, 0, n, call.dtype, seed),
        issue=lambda: [dist.reduce(buf, dst=dst, op=op, group=g, async_op=True)],
        result=buf if at_root else None,
        expect=_reduced_expect(call, 0, c) if at_root else None)


def _all_to_all(call: Call) -> Prepared:
    c, n, r, g = call.lay.count, call.lay.nranks, call.rank, call.group
    send, recv = _empty(c * n, call), _empty(c * n, call)

    def init(seed: int) -> None:
        recv.zero_()
        fill(send, "data", r, 0, n, call.dtype, seed)
    return Prepared(init, lambda: [dist.all_to_all_single(recv, send, group=g, async_op=True)],
                    recv, _data_expect(call, [(s, r * c, c) for s in range(n)]))


def _gather(call: Call) -> Prepared:
    c, n, r, g = call.lay.count, call.lay.nranks, call.rank, call.group
    at_root, dst = r == call.root, call.global_ranks[call.root]
    if call.place == "ip":
        recv = _empty(c * n, call)
        send = recv[r * c:(r + 1) * c]
    else:
        recv = _empty(c * n, call) if at_root else None
        send = _empty(c, call)
    parts = _chunks(recv, n) if at_root else None

    def init(seed: int) -> None:
        if recv is not None:
            recv.zero_()
        fill(send, "data", r, 0, n, call.dtype, seed)
    return Prepared(init, lambda: [dist.gather(send, parts, dst=dst, group=g, async_op=True)],
                    recv if at_root else None,
                    _data_expect(call, [(s, 0, c) for s in range(n)]) if at_root else None)


def _scatter(call: Call) -> Prepared:
    c, n, r, g = call.lay.count, call.lay.nranks, call.rank, call.group
    at_root, src = r == call.root, call.global_ranks[call.root]
    if call.place == "ip":
        send = _empty(c * n, call)
        recv = send[r * c:(r + 1) * c]
    else:
        send = _empty(c * n, call) if at_root else None
        recv = _empty(c, call)
    parts = _chunks(send, n) if at_root else None

    def init(seed: int) -> None:
        if call.place == "ip":
            send.zero_()
        else:
            recv.zero_()
        if at_root:
            fill(send, "data", r, 0, n, call.dtype, seed)
    return Prepared(init, lambda: [dist.scatter(recv, parts, src=src, group=g, async_op=True)],
                    recv, _data_expect(call, [(call.root, r * c, c)]))


def _sendrecv(call: Call) -> Prepared:
    """A ring: send to rank+1, receive from rank-1, grouped so NCCL cannot deadlock."""
    c, n, r, g = call.lay.count, call.lay.nranks, call.rank, call.group
    send, recv = _empty(c, call), _empty(c, call)
    to, frm = call.global_ranks[(r + 1) % n], call.global_ranks[(r - 1) % n]

    def init(seed: int) -> None:
        recv.zero_()
        fill(send, "data", r, 0, n, call.dtype, seed)

    def issue() -> list:
        return dist.batch_isend_irecv([dist.P2POp(dist.isend, send, to, g),
                                       dist.P2POp(dist.irecv, recv, frm, g)])
    return Prepared(init, issue, recv, _data_expect(call, [((r - 1) % n, 0, c)]))


BUILDERS: dict[str, Callable[[Call], Prepared]] = {
    "all_reduce": _all_reduce, "all_gather": _all_gather, "reduce_scatter": _reduce_scatter,
    "broadcast": _broadcast, "reduce": _reduce, "all_to_all": _all_to_all,
    "gather": _gather, "scatter": _scatter, "sendrecv": _sendrecv,
}


def build(call: Call) -> Prepared:
    """Allocate this rank's buffers for `call` (may raise out-of-memory)."""
    return BUILDERS[call.op](call)
