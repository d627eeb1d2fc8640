"""One timeline for every rank's events: each rank's CLOCK_MONOTONIC readings moved onto
the wall clock by the anchors its log holds (used by the Perfetto export)."""

from __future__ import annotations


class Clock:
    """Puts every rank's CLOCK_MONOTONIC readings on one timeline, in microseconds.

    CLOCK_MONOTONIC counts from its host's boot, so readings of two hosts cannot be
    compared. A rank's log header holds a (monotonic, wall) pair read together at its last
    heartbeat (its metadata one from its start); adding wall - monotonic puts the rank on
    the wall clock, which NTP keeps within about a millisecond across hosts: enough to look
    at, and diagnosis never relies on it (DESIGN.md, clock-independent diagnosis). A rank
    without a pair borrows one from a rank on its host (same monotonic clock); failing that,
    its host's first event is put at the run's start: order and durations stay right,
    alignment with other hosts is lost. Zero is the run's earliest event.
    """

    def __init__(self, run):
        first: dict[int, int] = {}
        self._end: dict[int, int] = {}
        for rank, evs in run.events.items():
            if not evs:
                continue
            first[rank] = min(e.t_enter_ns for e in evs)
            last = max(max(e.t_enter_ns, e.t_end_ns or 0) for e in evs)
            header = run.headers.get(rank)
            self._end[rank] = max(last, header.heartbeat_mono_ns if header else 0)
        hosts = {r: m.get("host") for r, m in run.meta.items() if isinstance(m, dict)}
        # One offset per host: its ranks share a monotonic clock, so they stay exactly
        # comparable (two ranks' anchors differ by the microseconds between the reads).
        offset: dict[int, int] = {}
        by_host: dict[str, int] = {}
        for rank in sorted(first):
            host = hosts.get(rank)
            pair = by_host.get(host) if host else None
            if pair is None:
                pair = _anchor(run.headers.get(rank), run.meta.get(rank))
                if pair is not None and host:
                    by_host[host] = pair
            if pair is not None:
                offset[rank] = pair
        anchored = len(offset)
        for rank in first:  # a rank without anchors, on a host with some
            if rank not in offset and hosts.get(rank) in by_host:
                offset[rank] = by_host[hosts[rank]]
        start = min((first[r] + off for r, off in offset.items()), default=0)
        loose: dict[object, list[int]] = {}
        for rank in first:
            if rank not in offset:
                loose.setdefault(hosts.get(rank) or ("rank", rank), []).append(rank)
        for ranks in loose.values():
            host_first = min(first[r] for r in ranks)
            for r in ranks:
                offset[r] = start - host_first
        self._offset = offset
        self.origin = min((first[r] + offset[r] for r in first), default=0)
        if not first:
            self.mode = "no events"
        elif loose:
            self.mode = ("relative: no clock anchors, each host's first event at 0"
                         if not anchored else "wall clock; hosts without anchors start at 0")
        else:
            self.mode = "wall clock (each rank's monotonic clock + its wall/monotonic anchor)"
        self.end_us = max((self.us(r, t) for r, t in self._end.items()), default=0.0)

    def knows(self, rank: int) -> bool:
        return rank in self._offset

    def us(self, rank: int, mono_ns: int) -> float:
        return (mono_ns + self._offset[rank] - self.origin) / 1000

    def rank_end_ns(self, rank: int) -> int:
        """The rank's clock is known up to its last heartbeat (or last event)."""
        return self._end[rank]

    def rank_end_us(self, rank: int | None) -> float:
        return self.us(rank, self._end[rank]) if rank in self._end else self.end_us


def _anchor(header, meta) -> int | None:
    """wall - monotonic for a rank, from its last heartbeat or else its start."""
    if header is not None and header.heartbeat_mono_ns > 0 and header.heartbeat_wall_ns > 0:
        return header.heartbeat_wall_ns - header.heartbeat_mono_ns
    clock = meta.get("clock") if isinstance(meta, dict) else None
    if isinstance(clock, dict):
        wall, mono = clock.get("wall_ns"), clock.get("monotonic_ns")
        if isinstance(wall, int) and isinstance(mono, int) and wall > 0 and mono > 0:
            return wall - mono
    return None
