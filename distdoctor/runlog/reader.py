"""Reader side of a rank's event log; safe to use while the rank is still writing.

`RankLog.read(since)` decodes the events numbered `since` and later that are still in the
ring. Slots are validated by their leading event number, so a slot being rewritten, or
overwritten after the ring wrapped, is skipped rather than misread.

The file is read with `pread`, not mapped: whatever a rank's process does to the file
(our writers never shrink one, but a job's code may truncate or rewrite it), a read past
its end is a short read and a one-line `ShrunkLog`, where a mapped page past the end
would kill the reader with SIGBUS.

Whatever is at a log's name is untrusted (a rank of another user, a crashed job, a copy):
it is opened without following a link and without waiting (a FIFO there would hold the
reader, and the live engine with it, for ever) and read only if it is a regular file; the
layout its header claims must fit in the file; and it is read in pieces of at most
READ_BYTES, so a header that claims a 2 GiB ring over a sparse file costs a piece at a
time, never 2 GB at once.
"""

from __future__ import annotations

import errno
import json
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

from distdoctor.errors import UserError
from distdoctor.privatefiles import NotRegularFile, open_regular
from distdoctor.runlog import format as F
from distdoctor.runlog import values as V
from distdoctor.runlog.event import Event
from distdoctor.runlog.slots import native_decoder
from distdoctor.runlog.values import READ_BYTES, READ_SLOTS

# a read of this many slots or more is first asked whether it lies in a hole of a sparse
# file (one lseek): a live poll's few new slots are read without asking
HOLE_CHECK_SLOTS = 512
MAX_STRING_BYTES = 16 << 20  # a string of the table (the tracer's whole table: 4 MiB)


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


class NotALog(UserError):
    """What is at a log's name is no regular file (a FIFO, a device, a link): refused
    without reading it."""


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
        self._fd, st = self._open()
        self._parked = False
        try:
            self._check_layout(st)
        except BaseException:
            os.close(self._fd)
            raise
        self._strings = _Strings()
        # string id -> its decoded fields (groups, tensor descriptions): most events of a
        # rank share a handful of them, and decoding is most of the cost of reading one
        self._groups: dict[int, tuple] = {}
        self._tensors: dict[int, tuple] = {}
        self._texts: dict[int, str] = {}  # string id -> a span name or error text

    def _open(self) -> tuple[int, os.stat_result]:
        try:
            return open_regular(self.path)
        except NotRegularFile as exc:
            raise NotALog(f"cannot read event log {self.path}: {exc.strerror}") from None
        except OSError as exc:
            raise UserError(f"cannot read event log {self.path}: "
                            f"{exc.strerror or exc}") from None

    def _check_layout(self, st: os.stat_result) -> None:
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
        if (slot_size != F.SLOT_SIZE or header_size != F.HEADER_SIZE or capacity < 1
                or s_off != F.HEADER_SIZE or r_off != s_off + s_size):
            raise UserError(f"event log {self.path} has an unexpected layout")
        if size < r_off + capacity * slot_size:
            raise UserError(f"event log {self.path} is truncated ({size} of "
                            f"{r_off + capacity * slot_size} bytes)")
        self.rank, self.pid, self.capacity = rank, pid, capacity
        self._strings_offset, self._strings_size, self._ring_offset = s_off, s_size, r_off
        self.log_number = F.U64.unpack_from(head, F.OFF_LOG_NUMBER)[0]
        self.created_wall_ns = F.I64.unpack_from(head, F.OFF_CREATED_WALL)[0]
        self.launch = V.launch_of(head)

    def park(self) -> None:
        """Close the file until the next read, which opens it again (the same file, or a
        ShrunkLog): a follower of more logs than it may hold open (follow.py)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd, self._parked = -1, True

    def _unpark(self) -> None:
        fd, st = self._open()
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
        """The strings added since the last call. The writer publishes `used` after the
        bytes, so every string within it is whole: one that is not (a zero length, which
        is never written, a length past `used` or over MAX_STRING_BYTES) ends the table
        for good. Read a piece at a time: `used` may claim a crafted 2 GiB of zeros."""
        st = self._strings
        used = min(self.word(F.OFF_STRINGS_USED), self._strings_size)
        while st.used < used:
            data = self._read(self._strings_offset + st.used, min(READ_BYTES, used - st.used))
            at, end = 0, len(data)
            while at + F.STRING_LEN.size <= end:
                (n,) = F.STRING_LEN.unpack_from(data, at)
                start = at + F.STRING_LEN.size
                if n == 0 or n > MAX_STRING_BYTES or st.used + start + n > used:
                    st.used = used  # no table from here on (zeros decoded one by one
                    return  # took minutes: a crafted pack)
                if start + n > end:
                    if at:
                        break  # the next piece starts with it
                    data += self._read(self._strings_offset + st.used + end, start + n - end)
                    end = len(data)
                try:
                    st.values.append(json.loads(data[start:start + n]))
                except (ValueError, UnicodeDecodeError, RecursionError):
                    st.values.append(None)  # a corrupt string: the event says "unknown"
                at = start + n
            if at == 0:  # under a length's 4 bytes left before `used`: no string
                st.used = used
                return
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
        out: list[Event] = []
        for at in range(start, head, READ_SLOTS):  # a piece at a time: a crafted head
            out += [ev for ev in self.read_range(at, min(head, at + READ_SLOTS))  # over a
                    if ev is not None]  # sparse ring holds a piece, never the ring
        return out

    def read_range(self, start: int, stop: int) -> list[Event | None]:
        """Events `start` .. `stop - 1`, None for each slot not holding its event (not
        written yet, being rewritten, overwritten). The slots are copied out and decoded
        a piece (READ_SLOTS) at a time per contiguous stretch of the ring; a piece of
        zeros (never written: a slot's first word is its event number + 1) is not."""
        out: list[Event | None] = []
        cap, decode = self.capacity, self._decode
        while start < stop:
            slot = start % cap
            n = min(stop - start, cap - slot, READ_SLOTS)
            at = self._ring_offset + slot * F.SLOT_SIZE
            if n >= HOLE_CHECK_SLOTS and self._hole(at, n * F.SLOT_SIZE):
                out += [None] * n  # never written: not read (a read fills the page cache)
                start += n
                continue
            data = self._read(at, n * F.SLOT_SIZE)
            if V.is_zeros(data):
                out += [None] * n
            elif _native is not None:
                evs, misses = _native.decode(data, start, self.rank, self._groups,
                                             self._tensors, _decoded_codes,
                                             self._strings.values, self._texts, Event)
                if misses:  # events naming what is not cached yet: decoded here
                    for i, ev in enumerate(evs):
                        if type(ev) is int:
                            evs[i] = decode(ev, _unpack_slot(data, i * F.SLOT_SIZE))
                out += evs
            else:
                e = start
                for rec in _iter_slots(data):
                    out.append(decode(e, rec) if rec[0] == e + 1 else None)
                    e += 1
            start += n
        return out

    def _hole(self, offset: int, n: int) -> bool:
        """Whether the file holds no data at `offset` .. `offset + n` (SEEK_DATA: the file
        system's word, which counts what is written but not yet on the disk as data;
        False where it cannot tell)."""
        if self._parked:
            self._unpark()
        try:
            return os.lseek(self._fd, offset, os.SEEK_DATA) >= offset + n
        except OSError as exc:
            return exc.errno == errno.ENXIO  # no data from `offset` to the end
        except AttributeError:  # (no SEEK_DATA on this system)
            return False

    def read_one(self, e: int) -> Event | None:
        """Event `e`, or None where its slot does not hold it (as read_range)."""
        return self.read_range(e, e + 1)[0]

    def _decode(self, e: int, rec: tuple) -> Event:
        (_, kind, status, op, redop, flags, _p, _p16, group_id, callsite_id, seq, peer,
         tensors_id, numel_in, numel_out, t_enter, t_end, span_index, name_id,
         error_id) = rec
        group = self._groups.get(group_id) or self._group(group_id)
        tensors = self._tensors.get(tensors_id) or self._tensor_desc(tensors_id)
        codes = _decoded_codes.get(V.code_word(kind, op, status, redop, flags)) or \
            _decode_codes(kind, op, status, redop, flags)
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
            self._text(name_id) if name_id else None,
            self._text(error_id) if error_id else None,
            codes[4], codes[5], codes[6],
        )

    def _text(self, sid: int) -> str | None:
        """A span name or error text; cached once the string is readable."""
        out = self._texts.get(sid)
        if out is None:
            value = self.string(sid)
            out = V.text(value)
            if value is not None:
                self._texts[sid] = out
        return out

    def _group(self, sid: int) -> tuple:
        """(name, desc, ranks) of a group string; cached once the string is readable. A
        string of another shape (a corrupt or crafted log: ranks that are no list of
        ranks) is an unknown group, as a string that is no JSON is."""
        value = self.string(sid)
        group = value if isinstance(value, dict) else {}
        ranks = group.get("ranks", ())
        out = (V.text(group.get("name", "?"), 256), V.text(group.get("desc", ""), 256),
               tuple(ranks) if V.rank_list(ranks) else ())
        if value is not None or sid == 0:  # id 0 is "unknown" for good
            self._groups[sid] = out
        return out

    def _tensor_desc(self, sid: int) -> tuple:
        """(shapes, dtypes, device) of a tensors string; cached once readable. Fields of
        another shape are unknown (empty), as in _group."""
        value = self.string(sid)
        desc = value if isinstance(value, dict) else {}
        shapes, dtypes = desc.get("shapes", ()), desc.get("dtypes", ())
        shapes_ok = (isinstance(shapes, list) and len(shapes) <= V.MAX_LIST
                     and all(V.shape(s) for s in shapes))
        dtypes_ok = (isinstance(dtypes, list) and len(dtypes) <= V.MAX_LIST
                     and all(isinstance(d, str) for d in dtypes))
        out = (tuple(tuple(s) for s in shapes) if shapes_ok else (),
               tuple(dtypes) if dtypes_ok else (), V.text(desc.get("device", ""), 256))
        if value is not None or sid == 0:
            self._tensors[sid] = out
        return out


# bound once: read_range runs for every event the live engine sees
_unpack_slot = F.SLOT.unpack_from
_native = native_decoder()
_iter_slots = struct.Struct(F.SLOT.format + f"{F.SLOT_SIZE - F.SLOT.size}x").iter_unpack
_IN_FLIGHT = F.STATUS_IN_FLIGHT
_decoded_codes, _decode_codes = V.decoded_codes, V.decode_codes
