"""A rank's position as its node's newest digest gave it (collect/digest.py), as the fleet
engine (fleet.py) keeps it: its newest op and newest finished op as the digest's rows,
decoded only when a detector needs them, what it issued per group, its clock, its exit
and state; and the reads of those rows the engine makes before decoding. Every field was
checked as the digest came in (digest_fields.position_of): decoding cannot fail."""

from __future__ import annotations

from distdoctor.collect.digest import row_event


class RankPosition:
    """A rank's position from its node's newest digest; its ops are decoded only when a
    detector needs them (thousands of ranks, a few digests a second each)."""

    __slots__ = ("rank", "rows", "events", "issued", "now_ns", "got_s", "exit", "stopped",
                 "host", "groups", "state")

    def __init__(self, host, rank, latest, last_done, issued, now_ns, got_s, exit_, stopped,
                 groups, state):
        self.host, self.rank, self.rows, self.events = host, rank, (latest, last_done), None
        self.issued, self.now_ns, self.got_s = issued, now_ns, got_s
        self.exit, self.stopped, self.groups = exit_, stopped, groups
        self.state = state  # digest.rank_state: exit failed, span, steps, ops completed

    def ops(self) -> tuple:
        """(newest op, newest finished op) as Events."""
        if self.events is None:
            self.events = tuple(self._decode(row) for row in self.rows)
        return self.events

    def _decode(self, row):
        return None if row is None else row_event(self.rank, row, self.groups)

    def stuck_s(self, now_ns: int | None) -> float:
        """How long its newest op has been in flight (0 when it is not); any failed op
        counts as stuck (the transport gave up first)."""
        row = self.rows[0]
        if row is None:
            return 0.0
        if row[3] in ("error", "timeout"):
            return float("inf")
        if row[14] is not None or now_ns is None:
            return 0.0
        return (now_ns - row[13]) / 1e9


def finished_callsites(positions) -> dict:
    """group -> the call site of the newest finished op the positions show in it."""
    out = {}
    for p in positions:
        row = p.rows[1]  # (digest.event_row: [.., group (4), .., callsite (12), ..])
        if row is not None and isinstance(row[12], list) and len(row[12]) == 3:
            out[str(row[4])] = {"file": row[12][0], "line": row[12][1],
                                "function": row[12][2]}
    return out
