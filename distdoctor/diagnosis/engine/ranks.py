"""What the diagnosis engine (core.py) keeps of each rank, as plain data."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from distdoctor.diagnosis.crashes.crash import ExitInfo
from distdoctor.diagnosis.parting.align import HISTORY
from distdoctor.runlog.reader import Event


@dataclass(slots=True)  # (its fields read by offset in engine/_ingest.c)
class RankState:
    """What the engine keeps of one rank: its newest ops, spans, heartbeat, exit."""

    rank: int
    latest: Event | None = None
    last_done: Event | None = None
    issued: dict[str, int] = field(default_factory=dict)
    spans: dict[int, str] = field(default_factory=dict)  # span_index -> name
    newest_span: str | None = None  # the span begun last (where a rank outside ops is)
    span_open: bool = False  # and it has not ended yet
    hb_ns: int = 0  # the rank's clock at its last heartbeat
    hb_seen_s: float | None = None  # engine clock when that heartbeat was first seen
    max_t_ns: int = 0  # the latest time seen in any of its events
    # (group, group desc, op) -> [ops completed, seconds inside them] (for /metrics)
    completed: dict[tuple, list] = field(default_factory=dict)
    exit: ExitInfo | None = None
    # its last ops (every group): where it parted from the others, after a failure
    recent: deque = field(default_factory=lambda: deque(maxlen=HISTORY))
    # group name -> (the member list its ops gave, GroupNames.variant of it)
    names: dict[str, tuple] = field(default_factory=dict)
