"""Writer side of a rank's event log: plain stores into a shared memory map.

Everything here runs on the job's hot path or on its threads, so it never raises into
the caller (the tracer wraps it) and never does file I/O after `create`: the kernel
writes the mapped pages back on its own, and keeps them if the process is killed.
"""

from __future__ import annotations

import itertools
import json
import mmap
import os
import threading
import time

from distdoctor.runlog import format as F

DEFAULT_RING_MIB = 60
DEFAULT_STRINGS_MIB = 4


class RingWriter:
    """Appends fixed-size event records to a memory-mapped ring file.

    A log is always a new file (a new inode), built whole under a temporary name and then
    put in place: a reader of an older log at the same name keeps its file, and never
    sees one shrink under its map (a read past the end of a shrunk map is SIGBUS)."""

    def __init__(self, path: str, rank: int, ring_bytes: int, strings_bytes: int,
                 pid: int | None = None, launch: dict | None = None, log_number: int = 0):
        """A new log at `path`, replacing whatever was there. `pid`, `launch`,
        `log_number`: the rank's (a collector's copy of another host's log names the
        rank's process and launch, not its own)."""
        self.path = path
        tmp = _temp_name(path)
        self._make(tmp, rank, ring_bytes, strings_bytes, pid, launch, log_number)
        os.replace(tmp, path)

    @classmethod
    def next_log(cls, run_dir: str, rank: int, ring_bytes: int, strings_bytes: int,
                 launch: dict | None = None) -> RingWriter:
        """The rank's next log in `run_dir`: its first (`rank-00003.ring`) or, when the
        rank ran before (a restart, a re-launch), the next free number. A name is taken
        by a hard link, which never replaces a file, so two processes claiming the same
        rank at once (two jobs sharing a run dir) get two logs."""
        from distdoctor.runlog import rundir

        self = cls.__new__(cls)
        tmp = _temp_name(str(rundir.ring_path(run_dir, rank)))
        n = rundir.next_log_number(run_dir, rank)
        self._make(tmp, rank, ring_bytes, strings_bytes, None, launch, n)
        try:
            while True:
                path = str(rundir.ring_path(run_dir, rank, n))
                try:
                    os.link(tmp, path)
                    break
                except FileExistsError:
                    n += 1
                    F.U64.pack_into(self._mm, F.OFF_LOG_NUMBER, n)
        finally:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        self.path, self.log_number = path, n
        return self

    def _make(self, path, rank, ring_bytes, strings_bytes, pid, launch, log_number) -> None:
        self.log_number = log_number
        self.capacity = max(16, ring_bytes // F.SLOT_SIZE)
        self.strings_offset = F.HEADER_SIZE
        self.strings_size = max(4096, strings_bytes)
        self.ring_offset = self.strings_offset + self.strings_size
        size = self.ring_offset + self.capacity * F.SLOT_SIZE

        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.ftruncate(fd, size)  # sparse: untouched slots cost no disk
            self._mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        F.HEADER_STATIC.pack_into(
            self._mm, 0, F.MAGIC, F.VERSION, F.HEADER_SIZE, F.SLOT_SIZE, self.capacity,
            self.strings_offset, self.strings_size, self.ring_offset, rank,
            os.getpid() if pid is None else pid,
        )
        F.U64.pack_into(self._mm, F.OFF_LOG_NUMBER, log_number)
        F.I64.pack_into(self._mm, F.OFF_CREATED_WALL, time.time_ns())
        if launch:
            data = json.dumps(launch, separators=(",", ":"), default=str).encode()
            if len(data) <= F.MAX_LAUNCH_BYTES:
                F.U32.pack_into(self._mm, F.OFF_LAUNCH, len(data))
                self._mm[F.OFF_LAUNCH + 4:F.OFF_LAUNCH + 4 + len(data)] = data
        self._events = itertools.count()  # next() is atomic under the GIL
        self._strings_used = 0
        self._strings_count = 0
        self._strings_dropped = 0
        self._string_lock = threading.Lock()
        self.heartbeat()

    # --- strings -------------------------------------------------------------------
    def add_string(self, value) -> int:
        """Append a JSON value to the string table; returns its id (0 when full)."""
        data = json.dumps(value, separators=(",", ":"), default=str).encode()
        with self._string_lock:
            need = F.STRING_LEN.size + len(data)
            if self._strings_used + need > self.strings_size:
                self._strings_dropped += 1
                F.U64.pack_into(self._mm, F.OFF_STRINGS_DROPPED, self._strings_dropped)
                return 0
            at = self.strings_offset + self._strings_used
            F.STRING_LEN.pack_into(self._mm, at, len(data))
            self._mm[at + F.STRING_LEN.size: at + need] = data
            self._strings_used += need
            self._strings_count += 1
            # Count last: a reader never sees a string id before its bytes.
            F.U64.pack_into(self._mm, F.OFF_STRINGS_USED, self._strings_used)
            F.U64.pack_into(self._mm, F.OFF_STRINGS_COUNT, self._strings_count)
            return self._strings_count

    # --- events --------------------------------------------------------------------
    def append(self, kind, op, redop, flags, group_id, callsite_id, seq, peer, tensors_id,
               numel_in, numel_out, t_enter_ns, span_index, name_id) -> int:
        """Write one record; returns its event number (pass it to `complete`)."""
        e = next(self._events)
        at = self.ring_offset + (e % self.capacity) * F.SLOT_SIZE
        mm = self._mm
        F.U64.pack_into(mm, at, 0)  # invalidate the slot while it is rewritten
        F.SLOT_BODY.pack_into(
            mm, at + 8, kind, F.STATUS_IN_FLIGHT, op, redop, flags, 0, 0, group_id,
            callsite_id, seq, peer, tensors_id, numel_in, numel_out, t_enter_ns, 0,
            span_index, name_id, 0,
        )
        F.U64.pack_into(mm, at, e + 1)
        F.U64.pack_into(mm, F.OFF_HEAD, e + 1)
        return e

    def complete(self, e: int, status: int, t_end_ns: int, error_id: int = 0) -> None:
        """Mark event `e` finished, unless its slot has since been reused."""
        at = self.ring_offset + (e % self.capacity) * F.SLOT_SIZE
        mm = self._mm
        if F.U64.unpack_from(mm, at)[0] != e + 1:
            return
        if error_id:
            F.U32.pack_into(mm, at + F.OFF_SLOT_ERROR, error_id)
        mm[at + F.OFF_SLOT_STATUS] = status
        F.I64.pack_into(mm, at + F.OFF_SLOT_END, t_end_ns)  # last: marks completion

    # --- replication (a collector's copy of another host's log) ----------------------
    def put_slot(self, e: int, record: bytes) -> None:
        """Event `e`'s 128-byte slot as the rank wrote it, stored as the rank stores it, so
        a reader of this copy never takes a half-copied slot: a new event's number word
        last (as `append`); an update of the event already there (its completion)
        without clearing that word, its end time last (as `complete`)."""
        at = self.ring_offset + (e % self.capacity) * F.SLOT_SIZE
        mm = self._mm
        if F.U64.unpack_from(mm, at)[0] == e + 1:
            end = F.OFF_SLOT_END
            mm[at + 8:at + end] = record[8:end]  # the status among them
            mm[at + end + 8:at + F.SLOT_SIZE] = record[end + 8:F.SLOT_SIZE]  # error id
            mm[at + end:at + end + 8] = record[end:end + 8]
            return
        F.U64.pack_into(mm, at, 0)
        mm[at + 8:at + F.SLOT_SIZE] = record[8:F.SLOT_SIZE]
        mm[at:at + 8] = record[:8]

    def head(self) -> int:
        """Events counted in the header (a copy: the head its last `put_state` gave)."""
        return F.U64.unpack_from(self._mm, F.OFF_HEAD)[0]

    def put_strings(self, offset: int, data: bytes) -> None:
        """Bytes of the rank's string table at `offset` (the counts follow in `put_state`)."""
        self._mm[self.strings_offset + offset:self.strings_offset + offset + len(data)] = data

    def put_state(self, head: int, strings_used: int, strings_count: int,
                  strings_dropped: int, heartbeat_mono_ns: int, heartbeat_wall_ns: int,
                  closed: bool) -> None:
        """The header words; sent after the slots and strings they count."""
        mm = self._mm
        F.U64.pack_into(mm, F.OFF_STRINGS_USED, strings_used)
        F.U64.pack_into(mm, F.OFF_STRINGS_COUNT, strings_count)
        F.U64.pack_into(mm, F.OFF_STRINGS_DROPPED, strings_dropped)
        F.U64.pack_into(mm, F.OFF_HEAD, head)
        F.I64.pack_into(mm, F.OFF_HEARTBEAT_MONO, heartbeat_mono_ns)
        F.I64.pack_into(mm, F.OFF_HEARTBEAT_WALL, heartbeat_wall_ns)
        F.U64.pack_into(mm, F.OFF_CLOSED, 1 if closed else 0)

    def close(self) -> None:
        self._mm.close()

    # --- liveness ------------------------------------------------------------------
    def heartbeat(self) -> None:
        F.I64.pack_into(self._mm, F.OFF_HEARTBEAT_MONO, time.monotonic_ns())
        F.I64.pack_into(self._mm, F.OFF_HEARTBEAT_WALL, time.time_ns())

    def mark_closed(self, exception_id: int = 0) -> None:
        """The process is exiting; `exception_id`: the uncaught exception that ends it (a
        later normal close at exit keeps that word)."""
        if exception_id:
            F.U32.pack_into(self._mm, F.OFF_EXIT_ERROR, exception_id)
            F.U64.pack_into(self._mm, F.OFF_CLOSED, F.CLOSED_RAISED)
        elif F.U64.unpack_from(self._mm, F.OFF_CLOSED)[0] != F.CLOSED_RAISED:
            F.U64.pack_into(self._mm, F.OFF_CLOSED, F.CLOSED_NORMALLY)


def _temp_name(path: str) -> str:
    """A name beside `path` that no reader lists (readers glob `rank-*`)."""
    head, tail = os.path.split(path)
    return os.path.join(head, f".{tail}.{os.getpid()}.{threading.get_ident()}.tmp")
