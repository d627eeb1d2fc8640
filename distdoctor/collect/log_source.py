"""One rank log as a node's forwarder (forward.py) sends it: how much of it the collector
has, and the frames that send the rest, in the rank's own order (the log opened, its
strings, its new slots, the completions of slots sent in flight, the header words that
count them); and when it is finished, so the forwarder lets it go.

The log is read only, as the live engine reads it; `send` is the forwarder's, which
writes one frame to the collector's connection (and raises OSError when it is lost)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

from distdoctor.collect import wire
from distdoctor.runlog import format as F
from distdoctor.runlog.reader import RankLog

MAX_PENDING = 4096  # in-flight events whose completion is still to be sent, per rank
RETIRE_S = 5.0  # a log left behind by a newer one of its rank, quiet this long, is done


class LogSource:
    """One rank log, read-only, and how much of it the collector has."""

    def __init__(self, path: Path, rank: int, number: int):
        self.rank, self.number = rank, number
        self.log = RankLog(path)
        self.meta_mtime = None
        self.quiet: tuple[int, float] | None = None  # heartbeat, seen unchanged since
        self.reset()

    def reset(self) -> None:
        """The collector has nothing of this log (a new connection)."""
        self.opened = False
        self.sent_head = None
        self.sent_strings = 0
        self.pending: dict[int, None] = {}
        self.stalled_at, self.stalls = -1, 0

    def finished(self, superseded: bool) -> bool:
        """All of it sent, and the rank closed it, or started again (a newer log) and this
        one's heartbeat has not moved for RETIRE_S: nothing more will come."""
        log = self.log
        if self.pending or self.sent_head is None or self.sent_head < log.word(F.OFF_HEAD):
            return False
        if log.word(F.OFF_CLOSED) in F.CLOSED_WORDS:
            return True
        if not superseded:
            return False
        now, hb = time.monotonic(), log.word(F.OFF_HEARTBEAT_MONO, F.I64)
        if self.quiet is None or self.quiet[0] != hb:
            self.quiet = (hb, now)
        return now - self.quiet[1] > RETIRE_S

    def close(self) -> None:
        self.log.close()

    # --- the frames --------------------------------------------------------------------
    def forward(self, send: Callable[[bytes], None]) -> None:
        """What the collector lacks of this log, as frames through `send`."""
        rank, number = self.rank, self.number
        log = self.log
        if not self.opened:
            launch = json.dumps(log.launch).encode() if log.launch else b""
            send(wire.frame(wire.OPEN, wire.OPEN_BODY.pack(
                log.capacity, log.strings_size, log.pid) + launch, rank, log=number))
            self.opened = True
        # the head first: the rank adds a string before the event that uses it, so the
        # strings read after the head cover every event up to it. Sent in the rank's
        # order, strings, then slots, then the header words that count them.
        head = log.word(F.OFF_HEAD)
        used = min(log.word(F.OFF_STRINGS_USED), log.strings_size)
        while self.sent_strings < used:
            n = min(used - self.sent_strings, wire.MAX_PAYLOAD)
            send(wire.frame(wire.STRINGS, log.raw_strings(
                self.sent_strings, self.sent_strings + n), rank, self.sent_strings, number))
            self.sent_strings += n
        count = log.word(F.OFF_STRINGS_COUNT)
        self._forward_new_slots(send, head)
        self._forward_completions(send)
        send(wire.frame(wire.STATE, wire.STATE_BODY.pack(
            self.sent_head, self.sent_strings, count, log.word(F.OFF_STRINGS_DROPPED),
            log.word(F.OFF_HEARTBEAT_MONO, F.I64), log.word(F.OFF_HEARTBEAT_WALL, F.I64),
            log.word(F.OFF_CLOSED) & 0xFF, log.word(F.OFF_EXIT_ERROR, F.U32),
            log.word(F.OFF_EXIT_CODE, F.I64)), rank, log=number))

    def _forward_new_slots(self, send: Callable[[bytes], None], head: int) -> None:
        start = max(self.sent_head or 0, head - min(self.log.capacity, wire.MIRROR_SLOTS))
        batch: list[bytes] = []
        raw_slot = self.log.raw_slot  # once, not per event
        first = e = start
        while e < head:
            rec = raw_slot(e)
            if F.U64.unpack_from(rec, 0)[0] != e + 1:
                # being written, or rewritten under a wrap: wait a pass or two, then skip
                if self.stalled_at != e:
                    self.stalled_at, self.stalls = e, 0
                self.stalls += 1
                if self.stalls < 3:
                    break
                self._send_slots(send, first, batch)
                batch, first, e = [], e + 1, e + 1
                continue
            batch.append(rec)
            if not _finished(rec):
                self.pending[e] = None
            if len(batch) == wire.SLOTS_PER_FRAME:
                self._send_slots(send, first, batch)
                batch, first = [], e + 1
            e += 1
        self._send_slots(send, first, batch)
        self.sent_head = e
        while len(self.pending) > MAX_PENDING:
            del self.pending[next(iter(self.pending))]

    def _forward_completions(self, send: Callable[[bytes], None]) -> None:
        oldest = self.sent_head - wire.MIRROR_SLOTS  # older ones are gone from the copy
        for e in list(self.pending):
            rec = self.log.raw_slot(e)
            if e < oldest or F.U64.unpack_from(rec, 0)[0] != e + 1:
                del self.pending[e]  # past the copy's window, or overwritten here
            elif _finished(rec):
                del self.pending[e]
                self._send_slots(send, e, [rec])

    def _send_slots(self, send: Callable[[bytes], None], first: int,
                    batch: list[bytes]) -> None:
        if batch:
            send(wire.frame(wire.SLOTS, b"".join(batch), self.rank, first, self.number))


def _finished(rec: bytes) -> bool:
    """Both halves of the completion are in (status, then end time: a slot copied
    between the two stores is not finished yet)."""
    return (rec[F.OFF_SLOT_STATUS] != F.STATUS_IN_FLIGHT
            and F.I64.unpack_from(rec, F.OFF_SLOT_END)[0] != 0)
