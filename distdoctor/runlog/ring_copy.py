"""A collector's copy of another host's log, opened again to write on into it (after the
collector let it go to stay within its open files, or after it started again on its own
copy): its layout and counts are read from its header, and nothing in it changes."""

from __future__ import annotations

import errno
import mmap
import os
import stat
import threading

from distdoctor.runlog import format as F
from distdoctor.runlog.ring import _NOFOLLOW, RingWriter
from distdoctor.runlog.shrink import ShrinkGuard


def open_copy(path: str) -> RingWriter:
    """An existing log at `path`, opened to write on into it (a collector's copy of
    another host's log, reopened after it was let go, or after the collector started
    again): its layout and counts are read from its header, and nothing already in
    it changes. OSError when it is missing, not a regular file, or not a log of ours
    (ValueError-free: a corrupt header is an OSError too)."""
    self = RingWriter.__new__(RingWriter)
    self.path = path
    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC | _NOFOLLOW)
    try:
        st = os.fstat(fd)
        head = os.pread(fd, F.HEADER_SIZE, 0)
        layout = _existing_layout(head, st)
        self._mm = mmap.mmap(fd, layout[-1], mmap.MAP_SHARED,
                             mmap.PROT_READ | mmap.PROT_WRITE)
    except BaseException:
        os.close(fd)
        raise
    # only the map's own descriptor stays open: space is reserved through the path
    # (_our_fd opens it when needed, checked to be this file)
    os.close(fd)
    self._fd = -2  # (not -1: close() would skip reopening to check the identity)
    self._identity = (st.st_dev, st.st_ino)
    capacity, strings_size, ring_offset, size = layout
    self._setup(capacity, strings_size, ring_offset, size)
    # a copy shrunk by another process under the collector ends there, as a rank's log
    # does (shrink.py); never looked at by size: that would keep a descriptor open
    self._guard = ShrinkGuard(self._mm, size, lambda: None, lambda: None)
    self.log_number = F.U64.unpack_from(self._mm, F.OFF_LOG_NUMBER)[0]
    self._strings_used = min(F.U64.unpack_from(self._mm, F.OFF_STRINGS_USED)[0],
                             strings_size)
    self._strings_count = F.U64.unpack_from(self._mm, F.OFF_STRINGS_COUNT)[0]
    self._strings_dropped = F.U64.unpack_from(self._mm, F.OFF_STRINGS_DROPPED)[0]
    self._string_lock = threading.Lock()
    return self


def _existing_layout(head: bytes, st: os.stat_result) -> tuple[int, int, int, int]:
    """(capacity, string table size, ring offset, file size) of an existing log's header,
    checked against the file (OSError when it is not one of our logs, whole)."""
    if not stat.S_ISREG(st.st_mode) or len(head) < F.HEADER_SIZE:
        raise OSError(errno.EINVAL, "not a whole event log")
    (magic, version, header_size, slot_size, capacity, s_off, s_size, r_off, _rank,
     _pid) = F.HEADER_STATIC.unpack_from(head, 0)
    size = r_off + capacity * slot_size
    if (magic != F.MAGIC or version > F.VERSION or header_size != F.HEADER_SIZE
            or slot_size != F.SLOT_SIZE or s_off != F.HEADER_SIZE or capacity < 16
            or r_off != s_off + s_size or st.st_size < size):
        raise OSError(errno.EINVAL, "not an event log of this distdoctor, or not whole")
    return capacity, s_size, r_off, size
