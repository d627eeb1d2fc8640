"""The files of the collector's copy (mirror.py): each rank log's copy, opened only while
it is in use, and the nodes' probe samples (who owns each rank: owners.py).

- `Copy`: one (rank, log)'s copy file. Its writer (2 descriptors: the file and the map's
  own) and its reader (1) are opened on demand and closed when `OpenCopies` needs the
  room; reopened, the writer writes on into the same file (runlog/ring_copy.py), so a
  reader of the copy keeps its place.
- `OpenCopies`: the open copies, least recently used first; past the budget
  (limits.copy_fd_budget) the oldest are closed. A copy in use on another thread (its
  lock held) is skipped, never closed under its writer.
- `reopen_copy`, `new_copy`: a log's copy file as a collector before us left it (to
  write on into), or made anew.
- `append_samples`: a node's probe samples, appended through a file opened per frame.

Files are created with O_NOFOLLOW (and O_EXCL where new): names come from a node's host,
ranks and log numbers, checked before, and no link in the run dir is ever followed.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import OrderedDict
from contextlib import contextmanager
from pathlib import Path

from distdoctor.collect import wire
from distdoctor.runlog import format as F
from distdoctor.runlog.ring import RingWriter
from distdoctor.runlog.ring_copy import open_copy

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


class Copy:
    """One rank log's copy: its path and layout, and its files while they are open."""

    __slots__ = ("key", "path", "layout", "lock", "writer", "reader", "ready", "files",
                 "lived", "made_s", "aside")

    def __init__(self, key: tuple[int, int], path: Path, layout: tuple, writer,
                 lived: bool = False):
        self.key, self.path, self.layout = key, path, layout
        # whether it shows its rank ran (an event, its close, its heartbeat moving; or
        # not known: a copy a collector before us made), since when it is written, and
        # whether it was set aside (set_aside.py: no node writes it again)
        self.lived, self.made_s, self.aside = lived, time.monotonic(), False
        self.lock = threading.Lock()  # held while written or read (OpenCopies skips it)
        self.writer, self.reader = writer, None
        self.ready = None  # (strings, ring) reserved on disk, kept across a reopen
        self.files = 0  # descriptors it holds open, as OpenCopies counts them

    def close_files(self) -> None:
        """Close its writer and reader (the caller holds `lock`, or the copy is idle)."""
        if self.writer is not None:
            self.ready = (self.writer._strings_ready, self.writer._ring_ready)
            self.writer.close()
            self.writer = None
        if self.reader is not None:
            self.reader.close()
            self.reader = None
        self.files = 0


class OpenCopies:
    def __init__(self, budget: int):
        self.budget = budget  # descriptors
        self.open_files = 0
        self.reopened = 0  # copies opened again after they were let go (a cost measure)
        self._lru: OrderedDict[tuple, Copy] = OrderedDict()
        self._lock = threading.Lock()

    @contextmanager
    def writing(self, copy: Copy):
        """The copy's writer, open (reopened if it was let go), while the block runs."""
        with copy.lock:
            if copy.writer is None:
                copy.writer = open_copy(str(copy.path))
                if copy.ready is not None:  # the same file: what was reserved still is
                    copy.writer._strings_ready, copy.writer._ring_ready = copy.ready
                self.reopened += 1
                self._opened(copy, 2)
            else:
                self._used(copy)
            yield copy.writer

    @contextmanager
    def reading(self, copy: Copy):
        """The copy's reader (a RankLog), open, while the block runs; UserError when the
        file cannot be read."""
        from distdoctor.runlog.reader import RankLog

        with copy.lock:
            if copy.reader is None:
                copy.reader = RankLog(copy.path)
                self._opened(copy, 1)
            else:
                self._used(copy)
            yield copy.reader

    def added(self, copy: Copy) -> None:
        """A copy made with its writer open."""
        self._opened(copy, 2)

    def _used(self, copy: Copy) -> None:
        with self._lock:
            if copy.key in self._lru:
                self._lru.move_to_end(copy.key)

    def _opened(self, copy: Copy, files: int) -> None:
        with self._lock:
            copy.files += files
            self.open_files += files
            self._lru[copy.key] = copy
            self._lru.move_to_end(copy.key)
            self._make_room(keep=copy)

    def _make_room(self, keep: Copy) -> None:
        """Close the least recently used copies until the budget holds (caller: _lock)."""
        for key in list(self._lru):
            if self.open_files <= self.budget:
                return
            other = self._lru[key]
            if other is keep or not other.lock.acquire(blocking=False):
                continue  # in use on another thread: the next one
            try:
                self.open_files -= other.files
                other.close_files()
                del self._lru[key]
            finally:
                other.lock.release()

    def forget(self, copy: Copy) -> None:
        """Close a copy for good (replaced by a new file, or the collector stops)."""
        with copy.lock, self._lock:
            self.open_files -= copy.files
            copy.close_files()
            self._lru.pop(copy.key, None)

    def close(self) -> None:
        with self._lock:
            copies = list(self._lru.values())
        for copy in copies:
            self.forget(copy)


def reopen_copy(path: Path, layout: tuple) -> RingWriter | None:
    """The copy a collector before us made at `path`, when it has this layout."""
    try:
        writer = open_copy(str(path))
    except OSError:
        return None
    pid = F.HEADER_STATIC.unpack_from(writer._mm, 0)[-1]
    if (writer.capacity, writer.strings_size, pid) == layout:
        return writer
    writer.close()
    return None


def new_copy(path: Path, rank: int, log: int, layout: tuple, launch) -> RingWriter:
    capacity, strings_size, pid = layout
    try:
        return RingWriter(str(path), rank, capacity * F.SLOT_SIZE, strings_size, pid=pid,
                          launch=launch, log_number=log)
    except OSError as exc:  # a full disk: refused now, in again once there is room
        raise wire.WireError(f"cannot make the copy of rank {rank}'s log in "
                             f"{path.parent}: {exc.strerror or exc}") from None


def append_samples(path: Path, host: str, text: str, max_bytes: int) -> None:
    """A node's probe sample lines, appended to its samples file in the copy (the file's
    header line first; at `max_bytes` the file becomes ".1", as probes/sampler.py's
    ProbeFile does). A file opened per frame: the copy holds none open between them."""
    from distdoctor.probes.sampler import FORMAT, VERSION

    path.parent.mkdir(parents=True, exist_ok=True)
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | _NOFOLLOW
    fd = os.open(path, flags, 0o644)
    try:
        size = os.fstat(fd).st_size
        if size and size + len(text) > max_bytes:
            os.close(fd)
            fd = -1
            os.replace(path, path.with_name(path.name + ".1"))
            fd = os.open(path, flags, 0o644)
            size = 0
        if size == 0:
            text = json.dumps({"format": FORMAT, "version": VERSION, "host": host,
                               "interval_s": 1.0, "started": time.time()}) + "\n" + text
        data = memoryview(text.encode())
        while data:
            data = data[os.write(fd, data):]
    finally:
        if fd >= 0:
            os.close(fd)
