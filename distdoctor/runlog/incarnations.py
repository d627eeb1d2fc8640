"""Which launch of the job each rank log belongs to.

A rank that starts again (an elastic restart, a second `torchrun` in a script, a test
suite spawning ranks per test, a re-initialised default group) writes a new log. The logs
of one launch, one per rank, form an *incarnation* of the job; the detectors compare ranks
within an incarnation only (rank 1 of the second launch never answers rank 0 of the
first), and every front end shows incarnations apart.

The ranks exchange nothing to agree on it. Each log's header carries its launch identity
(the store the ranks met at, the elastic restart count, the world size: see
tracer.install.launch_identity), and a rank's k-th log with a given identity belongs to
the k-th incarnation with it: two launches that share a store address (a fixed
MASTER_PORT, run twice in a row) are told apart by their order. Incarnations are numbered
0, 1, ... in the order they appear. Logs of older writers carry no identity: their one log
per rank is incarnation 0.
"""

from __future__ import annotations

import json


class Incarnations:
    """Numbers logs into incarnations; stable while logs keep appearing (live), so feed
    each rank's logs in their order and all logs in the order they were made."""

    def __init__(self) -> None:
        self._numbers: dict[tuple[str, int], int] = {}  # (identity, ordinal) -> number
        self._seen: dict[tuple[int, str], int] = {}  # (rank, identity) -> logs seen
        self.count = 0

    def assign(self, rank: int, launch: dict) -> int:
        identity = json.dumps(launch, sort_keys=True, default=str)
        ordinal = self._seen.get((rank, identity), 0)
        self._seen[(rank, identity)] = ordinal + 1
        number = self._numbers.get((identity, ordinal))
        if number is None:
            number = self._numbers[(identity, ordinal)] = self.count
            self.count += 1
        return number
