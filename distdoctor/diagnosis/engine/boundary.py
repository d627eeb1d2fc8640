"""The detectors' boundary: a detector that raises is said once and left out; the others,
hang handling and `--on-hang kill` go on (DESIGN principle 9, "the doctor does not die").

The engine calls each detector through `Boundary.call` (or, on the per-event path where a
function call per event costs, in a `try` of its own that hands the exception to
`Boundary.failed`). The first failure of a detector becomes an `internal` finding (a
warning that names no rank: it is distdoctor's fault, never the job's) with the exception
and the innermost distdoctor line it came from; later ones are counted in it. A detector
with state of its own (stragglers, threads, step times) is switched off after its first
failure, as its state may be half-updated; a pure function of the engine's state (hangs,
crashes, mismatches) is skipped for that pass and tried again on the next, since hangs are
what `--on-hang kill` waits for.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable

from distdoctor.findings import Finding

_HERE = os.path.abspath(__file__)
_PACKAGE = os.path.dirname(os.path.dirname(os.path.dirname(_HERE)))  # .../distdoctor
MESSAGE_CHARS = 300

# the module a failure was raised in -> the detector it belongs to (per-event feeds, where
# the engine's own `try` cannot tell which call raised)
MODULE_DETECTOR = {
    "stragglers/straggler.py": "straggler", "stragglers/waitgraph.py": "straggler",
    "stragglers/stepstats.py": "straggler", "stragglers/steptime.py": "step times",
    "hangs/waits.py": "waits", "mismatches/threads.py": "threads",
    "mismatches/mismatch.py": "mismatch", "hangs/hang.py": "hang", "crashes/crash.py": "crash",
    "stragglers/host_noise.py": "host noise", "stragglers/throttle.py": "throttle",
    "parting/parted.py": "parted", "parting/blame.py": "parted", "parting/branch.py": "parted",
    "parting/align.py": "parted", "parting/arms.py": "parted",
    "hangs/group_order.py": "group order",
}


def where_raised(exc: BaseException) -> str | None:
    """'diagnosis/stragglers/straggler.py:129': the innermost frame of the traceback in
    distdoctor (the boundary's own frames left out: they only passed the call on)."""
    site = None
    for frame, line in traceback.walk_tb(exc.__traceback__):
        path = os.path.abspath(frame.f_code.co_filename)
        if path.startswith(_PACKAGE + os.sep) and path != _HERE:
            site = f"{os.path.relpath(path, _PACKAGE)}:{line}"
    return site


def _caller_site() -> str | None:
    """The innermost distdoctor line outside the boundary on the current stack: where the
    detector was called from, when nothing of distdoctor's is in the traceback itself
    (the detector's code raised straight away, e.g. a function put in its place)."""
    frame = sys._getframe(1)
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        if path.startswith(_PACKAGE + os.sep) and path != _HERE:
            return f"{os.path.relpath(path, _PACKAGE)}:{frame.f_lineno}"
        frame = frame.f_back
    return None


def detector_of(exc: BaseException, default: str) -> str:
    """The detector whose module raised `exc` (the innermost distdoctor frame's)."""
    site = where_raised(exc)
    module = site.rsplit(":", 1)[0].removeprefix("diagnosis/") if site else ""
    return MODULE_DETECTOR.get(module, default)


def exception_text(exc: BaseException, site: str | None = None) -> str:
    """'TypeError("unsupported operand ...") at straggler.py:129' (`site`: where it was
    raised, else the innermost distdoctor frame of its traceback)."""
    message = str(exc)[:MESSAGE_CHARS]
    shown = f"{type(exc).__name__}({message!r})" if message else type(exc).__name__
    site = site or where_raised(exc)
    return shown + (f" at {os.path.basename(site)}" if site else "")


def internal_finding(detector: str, exc: BaseException, site: str | None, count: int,
                     off: bool, part: str | None = None, then: str | None = None) -> Finding:
    """distdoctor's own failure, said as such: never a culprit, never the job's fault.
    `part`: what failed, in words (the detector by default); `then`: what goes on."""
    message = str(exc)[:MESSAGE_CHARS]
    then = then or ("it is switched off, the other detectors go on" if off
                    else "it is tried again on the next pass, the other detectors go on")
    return Finding(
        "internal", "warning",
        f"distdoctor's {part or detector + ' detector'} failed: "
        f"{exception_text(exc, site)}; {then} (a bug "
        "in distdoctor, not in the job)",
        [], details={"detector": detector, "exception": type(exc).__name__,
                     "message": message, "site": site, "failures": count,
                     "switched_off": off},
        remedy="Report it to distdoctor with this run dir; `distdoctor diagnose` says what the "
               "other detectors found.")


class Boundary:
    def __init__(self, put: Callable[[tuple, Finding], None]):
        """`put(key, finding)`: where an internal finding goes (the engine's book)."""
        self._put = put
        self.off: set[str] = set()
        self.counts: dict[str, int] = {}
        self._first: dict[str, tuple[BaseException, str | None]] = {}

    def call(self, detector: str, fn: Callable, *args, default=None, keep_on: bool = False):
        """fn(*args), or `default` when the detector is off or raises."""
        if detector in self.off:
            return default
        try:
            return fn(*args)
        except Exception as exc:  # contained here: the engine goes on without it
            self.failed(detector, exc, keep_on=keep_on)
            return default

    def failed(self, detector: str, exc: BaseException, keep_on: bool = False) -> None:
        """Say a detector's failure: the first one; later ones are counted in it (the
        finding brought up to date now and then: a feed may fail on every event)."""
        n = self.counts[detector] = self.counts.get(detector, 0) + 1
        if not keep_on:
            self.off.add(detector)
        if detector not in self._first:
            self._first[detector] = (exc, where_raised(exc) or _caller_site())
        elif n & (n - 1):  # not a power of two: counted only
            return
        first, site = self._first[detector]
        f = internal_finding(detector, first, site, n, detector in self.off)
        # said once: a count that grows is an update, not news
        self._put(("internal", detector), f, n > 1)

    def is_off(self, detector: str) -> bool:
        return detector in self.off
