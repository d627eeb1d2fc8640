"""The collector's file descriptors: the open-files limit raised at start, and what an
accept that fails says.

Every connection is a descriptor, so the limit (`ulimit -n`, often 1,024) is the
collector's real cap. At start the soft limit is raised to the hard one; when even that
is low, one line says so. When accept() fails anyway (EMFILE, ENFILE, or anything else)
the listener goes on: the failure is said once a minute at most, with the limit and the
remedy, and the number of times it came; accepting starts again as soon as it can.
"""

from __future__ import annotations

import errno
import time
from collections.abc import Callable

ENOUGH_FILES = 4096  # nodes, the connections waiting to authenticate, the copy's files
WANTED_FILES = 65536
WINDOW_S = 60.0
RETRY_S = (0.05, 0.1, 0.25, 0.5, 1.0)  # pauses of the listener, growing while it fails


def open_files_limit() -> tuple[int, int]:
    """(soft, hard) RLIMIT_NOFILE; (-1, -1) where there is none (not POSIX)."""
    try:
        import resource

        return resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, OSError, ValueError):
        return -1, -1


def raise_open_files_limit() -> str | None:
    """The soft limit raised towards the hard one; a line to say when it stays low."""
    soft, hard = open_files_limit()
    if soft < 0:
        return None
    unlimited = hard < 0 or hard == _infinity()
    want = WANTED_FILES if unlimited else min(hard, WANTED_FILES)
    if soft < want:
        try:
            import resource

            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (OSError, ValueError):
            pass
    if soft >= ENOUGH_FILES:
        return None
    return (f"this collector may open {soft} files at most (ulimit -n; hard limit "
            f"{'unlimited' if unlimited else hard}): every node and every connection is "
            f"one; for more than a few hundred nodes raise it before starting it "
            f"(ulimit -n {WANTED_FILES})")


def _infinity() -> int:
    try:
        import resource

        return resource.RLIM_INFINITY
    except ImportError:
        return -1


class AcceptTrouble:
    """Failed accepts: said once a minute (a count for the rest), and the listener's
    pause before it tries again."""

    def __init__(self, say: Callable[[str], None], pending_cap: int,
                 clock: Callable[[], float] = time.monotonic):
        self._say, self._pending_cap, self._clock = say, pending_cap, clock
        self._said_at: dict[int, float] = {}  # errno -> when said
        self._since: dict[int, int] = {}  # errno -> failures since it was said
        self._failing = 0  # failures in a row (the pause grows)
        self._paused_since: float | None = None
        self._again_said_at = -WINDOW_S

    def failed(self, exc: OSError, freed: bool, room: int | None = None) -> None:
        """An accept failed; `freed`: an unauthenticated connection was dropped to free
        a descriptor (accepting goes on at once); `room`: not tried, this many
        connections are open already, all that the limit leaves them."""
        code = exc.errno or 0
        now = self._clock()
        self._failing += 1
        if self._paused_since is None:
            self._paused_since = now
        if code in self._said_at:
            self._since[code] = self._since.get(code, 0) + 1
            return
        self._said_at[code] = now
        self._say(self._line(exc, freed, room))

    def _line(self, exc: OSError, freed: bool, room: int | None) -> str:
        name = errno.errorcode.get(exc.errno or 0, "error")
        what = f"cannot accept a connection: {exc.strerror or exc} ({name})"
        if room is not None:
            what = (f"cannot accept a connection: {room} are open, all that the open-files "
                    f"limit leaves connections (one more and it is {name})")
        if exc.errno not in (errno.EMFILE, errno.ENFILE):
            return f"{what}; the listener pauses a moment and goes on"
        soft, hard = open_files_limit()
        where = ("the whole system is out of them (ENFILE: fs.file-max)"
                 if exc.errno == errno.ENFILE else
                 f"this collector may open {soft} (ulimit -n {soft}; hard limit {hard})")
        then = (f"an idle or silent unauthenticated connection (of {self._pending_cap} at "
                f"most) was dropped to make room" if freed else
                "the listener pauses and accepts again as soon as one is free (the next "
                "nodes wait)")
        return (f"{what}: out of file descriptors, {where}; raise the limit before starting "
                f"the collector (ulimit -n {max(WANTED_FILES, soft * 4)}); {then}")

    def retry_s(self) -> float:
        return RETRY_S[min(self._failing, len(RETRY_S)) - 1]

    def accepted(self) -> None:
        if self._paused_since is None:
            return
        now = self._clock()
        waited = now - self._paused_since
        self._failing, self._paused_since = 0, None
        # a moment's shortage (made up by a drop) is no news, nor one a minute after one
        if waited >= 1.0 and now - self._again_said_at >= WINDOW_S:
            self._again_said_at = now
            self._say(f"accepting connections again (after {waited:.0f} s)")

    def flush_if_due(self) -> None:
        now = self._clock()
        for code, when in list(self._said_at.items()):
            if now - when < WINDOW_S:
                continue
            n = self._since.pop(code, 0)
            if n:
                name = errno.errorcode.get(code, "error")
                self._say(f"cannot accept a connection: {name} {n} more time"
                          f"{'s' * (n != 1)} in the last minute")
                self._said_at[code] = now
            else:
                del self._said_at[code]
