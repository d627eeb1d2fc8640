"""A decoded event of a rank's log: what every reader (the live diagnosis, `diagnose`, the
collector, the exporters) works with. Kept apart from the reader so the C slot decoder's
contract (runlog/_decode.c: these fields, in this order, plain slots) stands in one place.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Event:
    """One traced op (or span) on one rank, decoded."""

    rank: int
    index: int  # event number on this rank (0-based, never reused)
    kind: str  # collective | p2p | span | sample
    op: str
    status: str  # in_flight | ok | error | timeout
    group: str  # process group name ("0" is the default group)
    group_desc: str
    group_ranks: tuple[int, ...]  # global ranks of the group, in group-rank order
    seq: int  # per group (collectives) or per group+direction+peer (p2p)
    peer: int | None  # root (rooted collectives) or peer (p2p), as a group rank
    shapes: tuple
    dtypes: tuple
    device: str
    numel_in: int
    numel_out: int
    reduce_op: str | None
    callsite: dict | None  # {"file", "line", "function"} of the user's code
    t_enter_ns: int  # CLOCK_MONOTONIC of the rank's host
    t_end_ns: int | None  # None while in flight
    span_index: int  # event number + 1 of the innermost open span, 0 for none
    name: str | None  # span name
    error: str | None
    is_async: bool | None  # None when the caller's async flag was not visible
    other_thread: bool
    implicit: bool = False  # a span the tracer opened itself: "step" (seq: its number), "data"

    @property
    def duration_ms(self) -> float | None:
        return None if self.t_end_ns is None else (self.t_end_ns - self.t_enter_ns) / 1e6

    @property
    def peer_global(self) -> int | None:
        """The root/peer as a global rank, when the group's ranks are known."""
        if self.peer is None or not (0 <= self.peer < len(self.group_ranks)):
            return self.peer
        return self.group_ranks[self.peer]
