"""Reader side of a rank's event log; safe to use while the rank is still writing.

`RankLog.read(since)` decodes the events numbered `since` and later that are still in the
ring. Slots are validated by their leading event number, so a slot being rewritten, or
overwritten after the ring wrapped, is skipped rather than misread.

The file is read with `pread`, not mapped: whatever a rank's process does to the file
(our writers never shrink one, but a job's code may truncate or rewrite it), a read past
its end is a short read and a one-line `ShrunkLog`, where a mapped page past the end
would kill the reader with SIGBUS.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

from distdoctor.errors import UserError
from distdoctor.runlog import format as F


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


@dataclass
class RingHeader:
    rank: int
    pid: int
    capacity: int
    head: int  # events ever written
    strings_dropped: int
    heartbeat_mono_ns: int
    heartbeat_wall_ns: int
    closed: bool
    exception: dict | None = None  # the uncaught exception that ended the rank
    unrecorded: int = 0  # events not recorded: the disk under the log was full
    exit_code: int | None = None  # the status it passed to os._exit or sys.exit, if any
    exit_call: dict | None = None  # that call: {type, code, file, line, function}

    @property
    def dropped(self) -> int:
        """Events overwritten because the ring wrapped."""
        return max(0, self.head - self.capacity)


class ShrunkLog(UserError):
    """The file got shorter under its reader: something other than distdoctor rewrote it."""


@dataclass
class _Strings:
    used: int = 0
    values: list = field(default_factory=lambda: [None])  # id 0 = unknown


class RankLog:
    """A read-only view of one rank's ring file."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        try:
            self._fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError as exc:
            raise UserError(f"cannot read event log {self.path}: {exc.strerror}") from None
        self._parked = False
        try:
            self._check_layout()
        except BaseException:
            os.close(self._fd)
            raise
        self._strings = _Strings()
        # string id -> its decoded fields (groups, tensor descriptions): most events of a
        # rank share a handful of them, and decoding is most of the cost of reading one
        self._groups: dict[int, tuple] = {}
        self._tensors: dict[int, tuple] = {}

    def _check_layout(self) -> None:
        st = os.fstat(self._fd)
        self._identity, size = (st.st_dev, st.st_ino), st.st_size
        if size < F.HEADER_SIZE:
            raise UserError(f"event log {self.path} is truncated ({size} bytes)")
        head = self._read(0, F.HEADER_SIZE)
        (magic, version, header_size, slot_size, capacity, s_off, s_size, r_off, rank,
         pid) = F.HEADER_STATIC.unpack_from(head, 0)
        if magic != F.MAGIC:
            raise UserError(f"{self.path} is not a distdoctor event log")
        if version > F.VERSION:
            raise UserError(f"event log {self.path} has format version {version}; this "
                            f"distdoctor reads up to {F.VERSION}: upgrade distdoctor")
        if slot_size != F.SLOT_SIZE or header_size != F.HEADER_SIZE:
            raise UserError(f"event log {self.path} has an unexpected layout")
        if size < r_off + capacity * slot_size:
            raise UserError(f"event log {self.path} is truncated ({size} of "
                            f"{r_off + capacity * slot_size} bytes)")
        self.rank, self.pid, self.capacity = rank, pid, capacity
        self._strings_offset, self._strings_size, self._ring_offset = s_off, s_size, r_off
        self.log_number = F.U64.unpack_from(head, F.OFF_LOG_NUMBER)[0]
        self.created_wall_ns = F.I64.unpack_from(head, F.OFF_CREATED_WALL)[0]
        self.launch = _launch_of(head)

    def park(self) -> None:
        """Close the file until the next read, which opens it again (the same file, or a
        ShrunkLog): a follower of more logs than it may hold open (follow.py)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd, self._parked = -1, True

    def _unpark(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        except OSError as exc:
            raise UserError(f"cannot read event log {self.path}: {exc.strerror}") from None
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != self._identity:
            os.close(fd)
            raise ShrunkLog(f"event log {self.path} was replaced under its reader (something "
                            f"other than distdoctor rewrote it); no longer read")
        self._fd, self._parked = fd, False

    def _read(self, offset: int, n: int) -> bytes:
        if self._parked:
            self._unpark()
        try:
            data = os.pread(self._fd, n, offset)
        except OSError as exc:
            raise UserError(f"cannot read event log {self.path}: {exc.strerror}") from None
        if len(data) != n:
            raise ShrunkLog(f"event log {self.path} shrank under its reader (something "
                            f"other than distdoctor rewrote it); no longer read")
        return data

    def close(self) -> None:
        fd, self._fd, self._parked = self._fd, -1, False
        if fd >= 0:
            os.close(fd)

    def header(self) -> RingHeader:
        words = self._read(0, F.HEADER_WORDS_END)
        closed = F.U64.unpack_from(words, F.OFF_CLOSED)[0]
        exception = exit_call = None
        if closed == F.CLOSED_RAISED:
            value = self.string(F.U32.unpack_from(words, F.OFF_EXIT_ERROR)[0])
            exception = value if isinstance(value, dict) else {"type": "exception"}
        elif closed == F.CLOSED_EXITED and F.U32.unpack_from(words, F.OFF_EXIT_ERROR)[0]:
            value = self.string(F.U32.unpack_from(words, F.OFF_EXIT_ERROR)[0])
            exit_call = value if isinstance(value, dict) else None
        return RingHeader(
            rank=self.rank, pid=self.pid, capacity=self.capacity,
            head=F.U64.unpack_from(words, F.OFF_HEAD)[0],
            strings_dropped=F.U64.unpack_from(words, F.OFF_STRINGS_DROPPED)[0],
            heartbeat_mono_ns=F.I64.unpack_from(words, F.OFF_HEARTBEAT_MONO)[0],
            heartbeat_wall_ns=F.I64.unpack_from(words, F.OFF_HEARTBEAT_WALL)[0],
            closed=closed in F.CLOSED_WORDS, exception=exception,
            unrecorded=F.U64.unpack_from(words, F.OFF_UNRECORDED)[0],
            exit_code=(F.I64.unpack_from(words, F.OFF_EXIT_CODE)[0]
                       if closed == F.CLOSED_EXITED else None),
            exit_call=exit_call,
        )

    # --- raw bytes, for a forwarder that copies the log as the rank wrote it -----------
    @property
    def strings_size(self) -> int:
        return self._strings_size

    def word(self, offset: int, fmt: struct.Struct = F.U64) -> int:
        """A header word as it is now (format.OFF_*)."""
        return fmt.unpack(self._read(offset, fmt.size))[0]

    def raw_strings(self, start: int, stop: int) -> bytes:
        return self._read(self._strings_offset + start, stop - start)

    def raw_slot(self, e: int) -> bytes:
        return self._read(self._ring_offset + (e % self.capacity) * F.SLOT_SIZE, F.SLOT_SIZE)

    # --- strings ---------------------------------------------------------------------
    def _load_strings(self) -> None:
        st = self._strings
        used = min(self.word(F.OFF_STRINGS_USED), self._strings_size)
        if used <= st.used:
            return
        data = self._read(self._strings_offset + st.used, used - st.used)
        at, end = 0, len(data)
        while at + F.STRING_LEN.size <= end:
            (n,) = F.STRING_LEN.unpack_from(data, at)
            start = at + F.STRING_LEN.size
            if n == 0:  # never written (JSON is one byte at least): the rest is no table;
                at = end  # zeros decoded one by one took minutes (a crafted pack)
                break
            if start + n > end:
                break
            try:
                st.values.append(json.loads(data[start:start + n]))
            except (ValueError, UnicodeDecodeError):
                st.values.append(None)  # a corrupt string: the event says "unknown"
            at = start + n
        st.used += at

    def string(self, sid: int):
        if sid >= len(self._strings.values):
            self._load_strings()
        values = self._strings.values
        return values[sid] if 0 <= sid < len(values) else None

    # --- events ----------------------------------------------------------------------
    def read(self, since: int = 0) -> list[Event]:
        """Events numbered >= `since` still present in the ring, oldest first."""
        head = self.word(F.OFF_HEAD)
        start = max(since, head - self.capacity, 0)
        return [ev for ev in self.read_range(start, head) if ev is not None]

    def read_range(self, start: int, stop: int) -> list[Event | None]:
        """Events `start` .. `stop - 1`, None for each slot not holding its event (not
        written yet, being rewritten, overwritten). The slots are copied out and decoded
        in one pass per contiguous stretch of the ring."""
        out: list[Event | None] = []
        cap, decode = self.capacity, self._decode
        while start < stop:
            slot = start % cap
            n = min(stop - start, cap - slot)
            at = self._ring_offset + slot * F.SLOT_SIZE
            e = start
            for rec in _iter_slots(self._read(at, n * F.SLOT_SIZE)):
                out.append(decode(e, rec) if rec[0] == e + 1 else None)
                e += 1
            start += n
        return out

    def read_one(self, e: int) -> Event | None:
        rec = _unpack_slot(self.raw_slot(e))
        if rec[0] != e + 1:
            return None  # not written yet, being rewritten, or overwritten
        return self._decode(e, rec)

    def _decode(self, e: int, rec: tuple) -> Event:
        (_, kind, status, op, redop, flags, _p, _p16, group_id, callsite_id, seq, peer,
         tensors_id, numel_in, numel_out, t_enter, t_end, span_index, name_id,
         error_id) = rec
        group = self._groups.get(group_id) or self._group(group_id)
        tensors = self._tensors.get(tensors_id) or self._tensor_desc(tensors_id)
        codes = _decoded_codes.get((kind, op, status, redop, flags)) or _decode_codes(
            kind, op, status, redop, flags)
        if status == _IN_FLIGHT:
            # completion writes the status, then t_end; a read between the two can see
            # the new t_end beside the old status: still in flight until both are there
            t_end = 0
        string = self.string
        callsite = string(callsite_id) if callsite_id else None
        if callsite is not None and not isinstance(callsite, dict):
            callsite = None  # a corrupt log's id pointing at another kind of string
        # positional, in Event's field order: the cheapest way to build one per event
        return Event(
            self.rank, e, codes[0], codes[1], codes[2], *group, seq,
            None if peer < 0 else peer, *tensors, numel_in, numel_out, codes[3],
            callsite, t_enter, t_end or None, span_index,
            _text(string(name_id)) if name_id else None,
            _text(string(error_id)) if error_id else None,
            codes[4], codes[5], codes[6],
        )

    def _group(self, sid: int) -> tuple:
        """(name, desc, ranks) of a group string; cached once the string is readable."""
        value = self.string(sid)
        group = value if isinstance(value, dict) else {}
        out = (str(group.get("name", "?")), str(group.get("desc", "")),
               tuple(group.get("ranks", ())))
        if value is not None or sid == 0:  # id 0 is "unknown" for good
            self._groups[sid] = out
        return out

    def _tensor_desc(self, sid: int) -> tuple:
        """(shapes, dtypes, device) of a tensors string; cached once readable."""
        value = self.string(sid)
        desc = value if isinstance(value, dict) else {}
        out = (tuple(tuple(s) for s in desc.get("shapes", ())),
               tuple(desc.get("dtypes", ())), str(desc.get("device", "")))
        if value is not None or sid == 0:
            self._tensors[sid] = out
        return out


def _text(value) -> str | None:
    """A name or error string (a corrupt log's id may point at another kind of value)."""
    return value if isinstance(value, str) or value is None else str(value)


def _launch_of(head: bytes) -> dict:
    """The header's launch identity ({} in an older writer's log, or one not readable)."""
    (n,) = F.U32.unpack_from(head, F.OFF_LAUNCH)
    if not 0 < n <= F.MAX_LAUNCH_BYTES:
        return {}
    try:
        value = json.loads(head[F.OFF_LAUNCH + 4:F.OFF_LAUNCH + 4 + n])
    except (ValueError, UnicodeDecodeError):
        return {}
    return value if isinstance(value, dict) else {}


# bound once: read_one runs for every event the live engine sees
_unpack_slot = F.SLOT.unpack_from
_iter_slots = struct.Struct(F.SLOT.format + f"{F.SLOT_SIZE - F.SLOT.size}x").iter_unpack
_decoded_codes: dict[tuple, tuple] = {}
_IN_FLIGHT = F.STATUS_IN_FLIGHT


def _decode_codes(kind, op, status, redop, flags) -> tuple:
    """(kind, op, status, reduce op, is_async, other_thread, implicit) of a slot's codes;
    few distinct combinations occur, so each is decoded once."""
    out = (F.KINDS.get(kind, "unknown"), F.OPS[op] if op < len(F.OPS) else "unknown",
           F.STATUSES.get(status, "unknown"),
           F.REDUCE_OPS[redop] if redop < len(F.REDUCE_OPS) else None,
           None if flags & F.FLAG_ASYNC_UNKNOWN else bool(flags & F.FLAG_ASYNC),
           bool(flags & F.FLAG_OTHER_THREAD), bool(flags & F.FLAG_IMPLICIT))
    if len(_decoded_codes) < 4096:  # bounded even for a corrupt log's random codes
        _decoded_codes[(kind, op, status, redop, flags)] = out
    return out
