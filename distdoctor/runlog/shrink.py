"""A rank's log shrunk under its writer by another process, and how the rank survives it.

A store through a shared map into a page past the end of a file that was truncated (a
clean-up script's `truncate -s 0`, `: > file`, a log rotator, `open(path, "w")`) is SIGBUS,
and it kills the rank, the job with it. Nothing unprivileged keeps another process of the
same user from shrinking a regular file: a lease conflicts with the writer's own writable
descriptor, seals are for memfds, `chattr +a` wants CAP_LINUX_IMMUTABLE, and mandatory locks
left Linux in 5.15. So the writer notices, and puts anonymous memory in the map's place
(one mmap with MAP_FIXED, the same address and size): every later store, from any thread
and any path (slots, header, strings; C or Python), lands in memory nothing reads, and the
log just ends. No check is added to the hot path.

Any check before a store leaves a window (a rank at 1,000 ops a second lost that race to
a watching Python thread 6 times in 6), so with the C extension the fault itself is
caught: a SIGBUS in a registered map makes the swap and the store runs again (_fast.c's
shrink guard; any other SIGBUS goes on to the handler or default that was there before).
The heartbeat's fstat, once a second and before the exit marks, then notices the log is
gone and stops the writers. Without the extension (DISTDOCTOR_PURE_PYTHON, no compiler) an
inotify watch does it (the kernel reports a truncation as IN_MODIFY), read by one thread
per process: within microseconds to a few milliseconds (it wants the GIL to act), and a
store in between is still SIGBUS (a real 2-rank job: 1 rank in 3 runs). A log replaced at
its name is no danger (its writer keeps the old file whole).
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import select
import struct
import sys
import threading

from distdoctor.runlog.slots import native_module

_IN_MODIFY = 0x2
# (mmap's module does not export it) x86-64, aarch64, ppc64le, s390x, riscv: torch's
_MAP_FIXED = 0x10 if os.uname().machine not in ("alpha", "parisc", "parisc64") else None
_EVENT = struct.Struct("iIII")  # struct inotify_event, before its name


def _libc():
    if not sys.platform.startswith("linux") or _MAP_FIXED is None:
        return None
    try:
        # PyDLL: the swap holds the GIL (a writer, which stores only under the GIL, cannot
        # run between the size seen short and the map replaced)
        libc = ctypes.PyDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                              ctypes.c_int, ctypes.c_long)
        libc.inotify_init1.argtypes = (ctypes.c_int,)
        libc.inotify_add_watch.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32)
        libc.inotify_rm_watch.argtypes = (ctypes.c_int, ctypes.c_int)
        return libc
    except (OSError, AttributeError):
        return None


class ShrinkGuard:
    """Watches one writer's map `mm` of `size` bytes over the file whose descriptor
    `fd_of()` gives (checked to be the log's, or None): `check()` swaps the map out when
    the file is shorter, then calls `on_shrunk()`; `stop()` before the map is closed."""

    def __init__(self, mm, size: int, fd_of, on_shrunk):
        self._size, self._fd_of, self._on_shrunk = size, fd_of, on_shrunk
        self._lock = threading.Lock()  # a swap and a close never overlap
        self.shrunk = False
        self._addr = None
        if _LIBC is not None:
            with contextlib.suppress(TypeError, ValueError):
                self._addr = ctypes.addressof(ctypes.c_char.from_buffer(mm))
        self._entry = self._wd = None
        if self._addr is not None and _NATIVE is not None:
            self._entry = _NATIVE.guard_map(self._addr, size)
        if self._addr is not None and self._entry in (None, -1):
            self._entry = None
            self._wd = _WATCHER.add(self, fd_of())

    def check(self) -> bool:
        """True while the log is whole (or cannot be looked at); False once shrunk."""
        with self._lock:
            if self.shrunk or self._addr is None:
                return not self.shrunk
            if self._entry is not None and _NATIVE.guard_hit(self._entry):
                self.shrunk = True  # swapped already, by the fault handler
            elif self._short():
                got = _LIBC.mmap(self._addr, self._size, mmap.PROT_READ | mmap.PROT_WRITE,
                                 mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_FIXED, -1, 0)
                self.shrunk = got == self._addr  # (else the file's map is still there)
        if self.shrunk:
            with contextlib.suppress(Exception):  # (a closed stderr: the flags are set first)
                self._on_shrunk()
        return not self.shrunk

    def _short(self) -> bool:
        fd = self._fd_of()
        try:
            return fd is not None and os.fstat(fd).st_size < self._size
        except OSError:
            return False

    def stop(self) -> None:
        with self._lock:
            self._addr = None
            if self._entry is not None:
                _NATIVE.guard_unmap(self._entry)
                self._entry = None
        if self._wd is not None:
            _WATCHER.remove(self._wd)
            self._wd = None


class _Watcher:
    """One inotify descriptor and one thread for the process's logs, made on first use
    (a rank that remakes its group writes a new log each time)."""

    def __init__(self):
        self._guards: dict[int, ShrinkGuard] = {}
        self._fd = -1
        self._pid = 0
        self._lock = threading.Lock()

    def add(self, guard: ShrinkGuard, fd: int | None) -> int | None:
        with self._lock:
            if fd is None or not self._started():
                return None
            wd = _LIBC.inotify_add_watch(self._fd, f"/proc/self/fd/{fd}".encode(), _IN_MODIFY)
            if wd < 0:
                return None  # (max_user_watches): the heartbeat's check alone
            self._guards[wd] = guard
            return wd

    def remove(self, wd: int) -> None:
        with self._lock:
            if self._guards.pop(wd, None) is not None and self._pid == os.getpid():
                _LIBC.inotify_rm_watch(self._fd, wd)

    def _started(self) -> bool:
        if self._pid == os.getpid():
            return self._fd >= 0
        self._pid, self._guards = os.getpid(), {}  # a forked child: its own, or none
        self._fd = _LIBC.inotify_init1(os.O_CLOEXEC)
        if self._fd < 0:
            return False  # (max_user_instances)
        threading.Thread(target=self._run, args=(self._fd,), name="distdoctor-log-guard",
                         daemon=True).start()
        return True

    def _run(self, fd: int) -> None:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        try:
            while True:
                for _, mask in poller.poll():
                    if mask & (select.POLLERR | select.POLLNVAL | select.POLLHUP):
                        return  # a job closed our descriptor: the heartbeat checks alone
                data, at = os.read(fd, 4096), 0
                while at + _EVENT.size <= len(data):
                    wd, _mask, _cookie, name_len = _EVENT.unpack_from(data, at)
                    at += _EVENT.size + name_len
                    guard = self._guards.get(wd)
                    if guard is not None:
                        guard.check()
        except Exception:
            pass
        with self._lock:
            if self._fd == fd:
                self._fd = -1  # (the number may be the job's by now: never used again)


_LIBC = _libc()
_NATIVE = native_module() if _LIBC is not None else None
_WATCHER = _Watcher()
