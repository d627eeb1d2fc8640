"""Writer side of a rank's event log: plain stores into a shared memory map.

Everything here runs on the job's hot path or on its threads, so it never raises into
the caller (the tracer wraps it) and never does file I/O on the hot path: the kernel
writes the mapped pages back on its own, and keeps them if the process is killed.

Disk space: the file is sparse (a 60 MiB ring costs what is written), and a store into a
page the file system cannot back (a full disk) kills the process with SIGBUS. So space is
reserved (posix_fallocate) ahead of the writers, by `reserve_ahead` on the recorder's
heartbeat thread, woken when the writers near the end of what is reserved; the hot path
only compares an offset. On a full disk events are counted as unrecorded instead of
written, and the job goes on.
"""

from __future__ import annotations

import errno
import json
import mmap
import os
import secrets
import sys
import threading
import time

from distdoctor.runlog import format as F
from distdoctor.runlog import reentry
from distdoctor.runlog.shrink import ShrinkGuard
from distdoctor.runlog.slots import make_slot_writer

DEFAULT_RING_MIB = 60
DEFAULT_STRINGS_MIB = 4
RESERVE_SLOTS_BYTES = 1 << 20  # ring space reserved ahead of the writers, at least
RESERVE_STRINGS_BYTES = 64 << 10  # string table space reserved ahead, at least
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


class RingWriter:
    """Appends fixed-size event records to a memory-mapped ring file.

    A log is always a new file (a new inode), built whole under a temporary name and then
    put in place: a reader of an older log at the same name keeps its file, and never
    sees one shrink under its map (a read past the end of a shrunk map is SIGBUS). One
    that another process shrinks under this writer ends there (shrink.py)."""

    _guard: ShrinkGuard | None = None  # (a collector's copy, ring_copy.py: none)

    def __init__(self, path: str, rank: int, ring_bytes: int, strings_bytes: int,
                 pid: int | None = None, launch: dict | None = None, log_number: int = 0):
        """A new log at `path`, replacing whatever was there. `pid`, `launch`,
        `log_number`: the rank's (a collector's copy of another host's log names the
        rank's process and launch, not its own)."""
        self.path = path
        tmp = _temp_name(path)
        try:
            self._make(tmp, rank, ring_bytes, strings_bytes, pid, launch, log_number)
            os.replace(tmp, path)  # (a rename replaces a link at `path`, never follows it)
        except BaseException:
            _remove_quietly(tmp)  # a full disk must not leave a name behind
            raise

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
        try:
            self._make(tmp, rank, ring_bytes, strings_bytes, None, launch, n)
        except BaseException:
            _remove_quietly(tmp)
            raise
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
            _remove_quietly(tmp)
        self.path, self.log_number = path, n
        return self

    def _make(self, path, rank, ring_bytes, strings_bytes, pid, launch, log_number) -> None:
        self.log_number = log_number
        capacity = max(16, ring_bytes // F.SLOT_SIZE)
        strings_size = max(4096, strings_bytes)
        ring_offset = F.HEADER_SIZE + strings_size
        size = ring_offset + capacity * F.SLOT_SIZE

        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | _NOFOLLOW,
                     0o644)
        try:
            os.ftruncate(fd, size)  # sparse: untouched slots cost no disk
            self._mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd  # kept open: space is reserved as the log fills (reserve_ahead)
        st = os.fstat(fd)
        self._identity = (st.st_dev, st.st_ino)  # a job may close our fd (see _our_fd)
        self._setup(capacity, strings_size, ring_offset, size)
        self._guard = ShrinkGuard(self._mm, size, self._our_fd, self._shrunk)
        if not self._reserve(F.HEADER_SIZE + RESERVE_STRINGS_BYTES,
                             self.ring_offset + RESERVE_SLOTS_BYTES):
            self.close()
            raise OSError(28, "no space left on the device for the event log")
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
        self._strings_used = 0
        self._strings_count = 0
        self._strings_dropped = 0
        self._string_lock = threading.Lock()
        self.heartbeat()

    def _setup(self, capacity: int, strings_size: int, ring_offset: int, size: int) -> None:
        """The layout's numbers and the slot writer over the map (nothing reserved yet)."""
        self.capacity, self.strings_size, self.ring_offset = capacity, strings_size, ring_offset
        self.strings_offset = F.HEADER_SIZE
        self.wake = threading.Event()  # set by a writer that nears the reserved end
        self.unrecorded = 0
        self._slots = make_slot_writer(self._mm, self.ring_offset, self.capacity,
                                       RESERVE_SLOTS_BYTES >> 1, self._near_end,
                                       self._unrecorded)
        # the hot path goes straight to the slot writer (C when built: runlog/slots.py)
        self.append, self.complete = self._slots.append, self._slots.complete
        self._ring_end = size
        self._ring_ready = self._strings_ready = 0
        self._reserved_head = 0

    # --- disk space ------------------------------------------------------------------
    def _our_fd(self) -> int | None:
        """The log's file descriptor, checked: a job that closes every descriptor (a
        daemonising library) and opens a file of its own may get our number back, and
        space must never be added to the job's file. Opened again by path if needed."""
        try:
            st = os.fstat(self._fd)
            if (st.st_dev, st.st_ino) == self._identity:
                return self._fd
        except OSError:
            pass
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC | _NOFOLLOW)
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) == self._identity:
                self._fd = fd
                return fd
            os.close(fd)
        except (OSError, TypeError):
            pass
        return None

    def _reserve(self, strings_to: int, ring_to: int) -> bool:
        """Back the file with disk up to these offsets; False when the disk is full."""
        strings_to = min(strings_to, self.ring_offset)
        ring_to = min(ring_to, self._ring_end)
        if (strings_to > self._strings_ready or ring_to > self._ring_ready) and (
                self._our_fd() is None):  # the file is gone: write as a sparse file does
            self._strings_ready = self._ring_ready = self._ring_end
            return True
        try:
            if strings_to > self._strings_ready:
                os.posix_fallocate(self._fd, self._strings_ready, strings_to - self._strings_ready)
                self._strings_ready = strings_to
            if ring_to > self._ring_ready:
                start = max(self._ring_ready, self.ring_offset)
                os.posix_fallocate(self._fd, start, ring_to - start)
                self._ring_ready = ring_to
        except OSError as exc:
            if exc.errno in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                self._strings_ready = self._ring_ready = self._ring_end  # cannot reserve
                return True
            return False
        return True

    def reserve_ahead(self) -> bool:
        """Keep disk reserved ahead of the writers: at least RESERVE_*_BYTES, and twice
        what was written since the last call. False when the disk is full."""
        self.wake.clear()
        if not self.whole():
            return True  # (space reserved now would grow the shrunk file again)
        if self._ring_ready >= self._ring_end and self._strings_ready >= self.ring_offset:
            return True
        head = F.U64.unpack_from(self._mm, F.OFF_HEAD)[0] + self.unrecorded
        written = (min(head, self.capacity)) * F.SLOT_SIZE
        burst = 2 * (head - self._reserved_head) * F.SLOT_SIZE
        self._reserved_head = head
        ok = self._reserve(
            self.strings_offset + self._strings_used + RESERVE_STRINGS_BYTES,
            self.ring_offset + written + max(RESERVE_SLOTS_BYTES, burst))
        if ok:
            self._starved = False
        return ok

    # --- strings -------------------------------------------------------------------
    def add_string(self, value) -> int:
        """Append a JSON value to the string table; returns its id (0 when full, or when
        this thread is inside a writer already: a signal handler's op, reentry.py)."""
        data = json.dumps(value, separators=(",", ":"), default=str).encode()
        if not reentry.enter():
            return 0
        try:
            return self._add_string(data)
        finally:
            reentry.leave()

    def _add_string(self, data: bytes) -> int:
        with self._string_lock:
            need = F.STRING_LEN.size + len(data)
            end = self.strings_offset + self._strings_used + need
            if end + RESERVE_STRINGS_BYTES // 2 > self._strings_ready:
                self.wake.set()
            if self._strings_used + need > self.strings_size or end > self._strings_ready:
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
    # append(kind, op, redop, flags, group_id, callsite_id, seq, peer, tensors_id,
    #        numel_in, numel_out, t_enter_ns, span_index, name_id) -> event number, or -1
    #        when the disk under the log is full; and complete(e, status, t_end_ns,
    #        error_id=0): the slot writer's own methods, bound in _make.

    # the ring's reserved end and the disk-full flag live in the slot writer
    _ring_ready = property(lambda self: self._slots.ready,
                           lambda self, v: setattr(self._slots, "ready", v))
    _starved = property(lambda self: self._slots.starved,
                        lambda self, v: setattr(self._slots, "starved", v))

    def _near_end(self, at: int) -> bool:
        """A writer at offset `at` nears the end of the reserved space: wake the reserver.
        False when the slot itself is not backed (the disk is full)."""
        if reentry.enter():  # else the call this one interrupts wakes it (reentry.py)
            try:
                self.wake.set()
            finally:
                reentry.leave()
        if at + F.SLOT_SIZE > self._ring_ready:
            self._starved = True
            return False
        return True

    def _unrecorded(self) -> int:
        self.unrecorded += 1
        F.U64.pack_into(self._mm, F.OFF_UNRECORDED, self.unrecorded)
        return -1

    # --- replication (a collector's copy of another host's log) ----------------------
    def _ensure(self, strings_to: int, ring_to: int) -> None:
        """Reserve space before a collector's copy writes there (OSError: disk full)."""
        if ((strings_to > self._strings_ready or ring_to > self._ring_ready)
                and not self._reserve(strings_to + RESERVE_STRINGS_BYTES,
                                      ring_to + RESERVE_SLOTS_BYTES)):
            raise OSError(28, "no space left on the device for the copy of a log")

    def put_slot(self, e: int, record: bytes) -> None:
        """Event `e`'s 128-byte slot as the rank wrote it, stored as the rank stores it, so
        a reader of this copy never takes a half-copied slot: a new event's number word
        last (as `append`); an update of the event already there (its completion)
        without clearing that word, its end time last (as `complete`)."""
        at = self.ring_offset + (e % self.capacity) * F.SLOT_SIZE
        self._ensure(0, at + F.SLOT_SIZE)
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
        self._ensure(self.strings_offset + offset + len(data), 0)
        self._mm[self.strings_offset + offset:self.strings_offset + offset + len(data)] = data

    def put_state(self, head: int, strings_used: int, strings_count: int,
                  strings_dropped: int, heartbeat_mono_ns: int, heartbeat_wall_ns: int,
                  closed: int, exit_error: int = 0, exit_code: int = 0) -> None:
        """The header words; sent after the slots and strings they count. `closed`: the
        log's CLOSED_* word, with the exception's string id or the os._exit status."""
        mm = self._mm
        F.U64.pack_into(mm, F.OFF_STRINGS_USED, strings_used)
        F.U64.pack_into(mm, F.OFF_STRINGS_COUNT, strings_count)
        F.U64.pack_into(mm, F.OFF_STRINGS_DROPPED, strings_dropped)
        F.U64.pack_into(mm, F.OFF_HEAD, head)
        F.I64.pack_into(mm, F.OFF_HEARTBEAT_MONO, heartbeat_mono_ns)
        F.I64.pack_into(mm, F.OFF_HEARTBEAT_WALL, heartbeat_wall_ns)
        F.U32.pack_into(mm, F.OFF_EXIT_ERROR, exit_error)
        F.I64.pack_into(mm, F.OFF_EXIT_CODE, exit_code)
        F.U64.pack_into(mm, F.OFF_CLOSED, closed if closed in F.CLOSED_WORDS else 0)

    def close(self) -> None:
        if self._guard is not None:
            self._guard.stop()  # before the map goes: a swap must not land on what follows
        slots = getattr(self, "_slots", None)
        if slots is not None:
            slots.release()  # the C writer holds the map's buffer
        self._mm.close()
        fd = self._our_fd() if self._fd >= 0 else None
        if fd is not None:
            os.close(fd)
        self._fd = -1

    def intact(self) -> bool:
        """The log file is still whole at its path. A job may truncate or delete it under
        us; a store past the end of a shrunk file is SIGBUS, so writers that nothing
        forces to write (the sampler) look first (a stat: ~2 us)."""
        try:
            return os.stat(self.path).st_size >= self._ring_end
        except OSError:
            return False

    def whole(self) -> bool:
        """False once the log was shrunk under its map: every store then lands in memory
        nothing reads (shrink.py). An fstat (~1 us): the heartbeat and exit marks look."""
        return self._guard is None or self._guard.check()

    def _shrunk(self) -> None:
        """The map was swapped out (shrink.py): no slot is written, no space reserved (it
        would grow the file again), and the rank says so once, on the thread that saw it."""
        self._ring_ready, self._starved = self._ring_end, True
        print(f"distdoctor: this rank's event log {self.path} was shrunk by something other "
              "than distdoctor: its events are no longer recorded (the job goes on)",
              file=sys.stderr)

    # --- liveness ------------------------------------------------------------------
    def heartbeat(self) -> None:
        self.whole()
        F.I64.pack_into(self._mm, F.OFF_HEARTBEAT_MONO, time.monotonic_ns())
        F.I64.pack_into(self._mm, F.OFF_HEARTBEAT_WALL, time.time_ns())

    def mark_exited(self, status: int, call_id: int = 0) -> None:
        """The process leaves through os._exit(status) (no exit hooks will mark it) or
        sys.exit(status); `call_id`: the string of the call's line. An uncaught exception
        already noted stays the cause."""
        self.whole()
        if F.U64.unpack_from(self._mm, F.OFF_CLOSED)[0] != F.CLOSED_RAISED:
            F.I64.pack_into(self._mm, F.OFF_EXIT_CODE, status)
            F.U32.pack_into(self._mm, F.OFF_EXIT_ERROR, call_id)
            F.U64.pack_into(self._mm, F.OFF_CLOSED, F.CLOSED_EXITED)

    def mark_closed(self, exception_id: int = 0) -> None:
        """The process is exiting; `exception_id`: the uncaught exception that ends it (a
        later normal close at exit keeps that word, and a status sys.exit gave)."""
        self.whole()
        if exception_id:
            F.U32.pack_into(self._mm, F.OFF_EXIT_ERROR, exception_id)
            F.U64.pack_into(self._mm, F.OFF_CLOSED, F.CLOSED_RAISED)
        elif F.U64.unpack_from(self._mm, F.OFF_CLOSED)[0] not in (F.CLOSED_RAISED,
                                                                  F.CLOSED_EXITED):
            F.U64.pack_into(self._mm, F.OFF_CLOSED, F.CLOSED_NORMALLY)


def _temp_name(path: str) -> str:
    """A name beside `path` that no reader lists (readers glob `rank-*`), never used
    before: a temp file left by a crash (or a thread id reused) is no reason to fail."""
    head, tail = os.path.split(path)
    return os.path.join(head, f".{tail}.{os.getpid()}.{secrets.token_hex(6)}.tmp")


def _remove_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
