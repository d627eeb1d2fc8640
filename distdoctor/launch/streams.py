"""run's own stdout and stderr, which the ranks' output passes through: writes that
neither fail the job nor lose what they carry.

Two ways a write to them goes wrong while the job is fine:
- their reader is gone (`distdoctor run ... | head`, a hung-up terminal, a full disk):
  the stream is pointed at /dev/null and run goes on quietly (`Unfailing`);
- they share an open file description made non-blocking by someone else (a terminal that
  another program left so, a pipe its reader set so): once the reader lags, a write fails
  with EAGAIN. The relay dropped what it could not write at once, and run's first EAGAIN
  silenced it for good. Now the stream gets a description of its own, blocking
  (`own_blocking`), as it would be had nobody set the flag; where that cannot be done, a
  write waits until the reader makes room.
"""

from __future__ import annotations

import fcntl
import os
import select
import stat
import sys
import threading

# one forwarder's lines at a time, per stream: with one lock for all, a stdout whose
# reader waits (`distdoctor run ... | less`) held the ranks' stderr back with it
_LOCKS: dict[int, threading.Lock] = {}
_LOCKS_LOCK = threading.Lock()


def _lock_of(out) -> threading.Lock:
    with _LOCKS_LOCK:
        lock = _LOCKS.get(id(out))
        if lock is None:
            lock = _LOCKS[id(out)] = threading.Lock()
        return lock


def own_blocking(fd: int) -> bool:
    """True when writes to `fd` block (now): if its open file description is non-blocking
    and it is a pipe or a terminal, `fd` is pointed at a new description of the same pipe
    or terminal, opened blocking (through /proc/self/fd: the other holders keep their own,
    flag and all). A regular file never answers EAGAIN; a socket cannot be reopened."""
    try:
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        if not flags & os.O_NONBLOCK:
            return True
        mode = os.fstat(fd).st_mode
        if not (stat.S_ISFIFO(mode) or stat.S_ISCHR(mode)):
            return False
        # opened non-blocking (a pipe with no reader left would block the open for good:
        # ENXIO instead), then made blocking: this description is ours alone
        new = os.open(f"/proc/self/fd/{fd}",
                      (flags & os.O_ACCMODE) | os.O_NOCTTY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        os.set_blocking(new, True)
    except OSError:
        os.close(new)
        return False
    try:
        os.dup2(new, fd)
    except OSError:
        return False
    finally:
        os.close(new)
    return True


def _room(fd: int) -> None:
    """Back from EAGAIN: made blocking, or else waited on until its reader makes room."""
    if not own_blocking(fd):
        select.select([], [fd], [], 1.0)


def write_all(out, data: bytes) -> None:
    """`data` to the byte stream `out` (run's stdout or stderr), whole, under that
    stream's lock; what `out`'s own buffer holds goes first. Raises what a gone reader
    raises."""
    with _lock_of(out):
        try:
            fd = out.fileno()
        except (AttributeError, OSError, ValueError):  # not a file (a test's sink)
            out.write(data)
            out.flush()
            return
        _flush(out, fd)
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(fd, view):]
            except BlockingIOError:
                _room(fd)


def _flush(stream, fd: int) -> None:
    while True:
        try:
            stream.flush()
            return
        except BlockingIOError:
            _room(fd)


class Unfailing:
    """One of run's own streams (stdout, stderr) once its reader may be gone (`distdoctor
    run ... 2>&1 | head`, a log on a full disk, a hung-up terminal): a write that fails
    points the stream's descriptor at /dev/null, as the Python docs advise for a closed
    pipe, and what run says from then on is dropped. run goes on with the job and
    returns its exit code. Before, the first failed print ended run with a wrong code,
    and in the diagnosis thread rich's answer to a closed pipe (SystemExit) ended the
    live diagnosis: --on-hang kill never stopped the hung job. EAGAIN is not a gone
    reader: the stream is made blocking (or waited on) and what was held goes out."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BlockingIOError:  # the text is in the stream's buffers: flushed next
            self.flush()
            return len(text)
        except OSError:
            self._gone()
            return len(text)

    def flush(self) -> None:
        try:
            _flush(self._stream, self._stream.fileno())
        except OSError:
            self._gone()
        except ValueError:  # closed
            pass

    def _gone(self) -> None:
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, self._stream.fileno())
            os.close(null)
            self._stream.flush()  # what it held goes to /dev/null: nothing left to fail
        except (OSError, ValueError):
            pass

    def __getattr__(self, name):
        return getattr(self._stream, name)


def unfailing_streams() -> None:
    """Make run's stdout and stderr `Unfailing` (and blocking: `own_blocking`) for the
    rest of the process. One closed when run started (Python's is None then) is
    /dev/null: the relay once wrote the ranks' output to None, its thread died and the
    ranks blocked on their full pipes."""
    while True:  # descriptors 0-2 open (on /dev/null), as a daemon makes them: no file
        fd = os.open(os.devnull, os.O_RDWR)  # or pipe run opens takes one of their numbers
        if fd > 2:
            os.close(fd)
            break
    for fd in (1, 2):
        own_blocking(fd)
    sys.stdout, sys.stderr = (Unfailing(s if s is not None else open(os.devnull, "w"))
                              for s in (sys.stdout, sys.stderr))
