"""Errors no family knows: the fallback that keeps a failed job's log from ending in silence.

The scanner hands this module only the lines nothing else claimed and that no open traceback
consumed. What counts as an error line, at the start of the message (after the prefixes):

- `SomethingError: ...` / `pkg.SomethingException: ...` (an exception printed with no
  traceback, or the traceback's head lost to a cut log);
- `terminate called after throwing an instance of 'T'` and the `what():` line after it (a
  C++ exception that ended the process; the reader hands over the what() line, and the
  terminate line where another anchor brings it);
- `Fatal Python error: ...` and the first frame of the user's code in faulthandler's dump;
- a shell's report of its child's signal (`Segmentation fault (core dumped)`).

Each is an UNKNOWN signal: the reasoning (fallback.py) turns the first of them in time into
a finding only where no family found an error, so what a family knows always wins. Words
that merely contain "error" (`error_if_nonfinite`, `Error rate 0.1`, `UserWarning`) are no
error lines: the name must be a class name ending the way exception classes end.
"""

from __future__ import annotations

import re

from distdoctor.logs.bounds import small_int
from distdoctor.logs.dumps import torn_piece
from distdoctor.logs.lines import LogLine
from distdoctor.logs.signals import UNKNOWN, Signal

NAME = "unknown"

# what the reader must hand over for these rules (the scanner's cover, families/__init__.py)
# (no "terminate called": a word with no rare byte costs the reader a pass over every chunk;
# the what() line after it says the same and more)
ANCHORS = (b"Error", b"Exception", b"Failure", b"what():", b"Fatal Python error", b'File "',
           b"Aborted", b"Segmentation fault", b"Bus error", b"Illegal instruction",
           b"Floating point exception", b"Caught signal", b"received at time=",
           b"Process received signal", b"Signal: ", b"End of error message")

_EXC = re.compile(r"^(?P<type>(?:[A-Za-z_]\w*\.)*(?:[A-Z][A-Za-z0-9_]*(?:Error|Exception|"
                  r"Failure)|Exception))(?::[ \t]*(?P<message>.*))?$")
_TERMINATE = re.compile(r"^terminate called (?:after throwing an instance of '(?P<type>[^']+)'|"
                        r"(?P<bare>without an active exception|recursively))")
_WHAT = re.compile(r"^\s*what\(\):\s*(?P<message>.*)$")
_FATAL = re.compile(r"^Fatal Python error: (?P<message>.+)$")
_FATAL_HEAD = "Fatal Python error: "
MAX_TORN = 64  # fatal errors counted in one torn line
# faulthandler's frames: `File "x.py", line 12 in f` (no comma before "in")
_FAULT_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<function>\S+)')
_SHELL_SIGNAL = re.compile(r"^(?:\S+: line \d+: +\d+ )?(?P<message>Segmentation fault|Aborted|"
                           r"Bus error|Illegal instruction|Floating point exception)"
                           r"(?: \(core dumped\))?(?:\s+\S.*)?$")
# a native library's own fatal-signal handler: UCX's "Caught signal 11 (Segmentation fault: ..)",
# absl's (Ray's C++) "*** SIGSEGV received at time=..", Open MPI's "*** Process received signal
# ***" / "Signal: Bus error (7)" / "*** End of error message ***"
_NATIVE_SIGNAL = re.compile(r"Caught signal \d+ \((?P<what>[^):]+)|\*\*\* (?P<sig>SIG[A-Z]+) "
                            r"received at time=|\*\*\* Process received signal \*\*\*|^Signal: "
                            r"(?P<what2>[A-Z][a-z]+(?: [a-z]+)*) \(\d+\)|\*\*\* End of error message")
_LIBRARY = re.compile(r"/(?:site|dist)-packages/|/lib/python3\.\d+/|^<frozen ")
# exception names that are a program's normal way out, or a launcher tearing down
_NOT_ERRORS = re.compile(r"(?:^|\.)(?:ChildFailedError|SignalException|StopIteration|"
                         r"KeyboardInterrupt|SystemExit)$")
MAX_OPEN = 1_000


def _untorn(message: str) -> tuple[str, int]:
    """A fatal error's message, and how many processes' errors its line holds."""
    k = 1 + message.count(_FATAL_HEAD)
    if k == 1 or k > MAX_TORN:
        return message, 1
    message = message.replace(_FATAL_HEAD, "")
    unit = len(message) // k
    if unit and message == message[:unit] * k:  # each wrote the same words
        message = message[:unit]
    return message, k


class UnknownErrors:
    """Not a `Family`: it reads only what every family and the tracebacks passed over."""

    name = NAME
    anchors = ANCHORS

    def __init__(self):
        # per process: the terminate/fatal signal still taking its what() or its frame
        self._open: dict[object, Signal] = {}
        # the last terminate still waiting for its what() line, whoever prints that line (an
        # unprefixed terminate's what() may carry the "[Rank N]" of the message it quotes)
        self._terminate: Signal | None = None

    def claimed(self, line: LogLine) -> None:
        """A line a family knew: the what() of a terminate makes that terminate known."""
        if self._terminate is not None and _WHAT.match(line.text):
            self._terminate.fields["known"] = True
            self._terminate = None

    def feed(self, line: LogLine) -> list[Signal]:
        text = line.text.strip()
        if not text:
            return []
        if m := _WHAT.match(text):
            if self._terminate is None:  # its "terminate called" line was not handed over
                return [Signal("error_line", NAME, UNKNOWN, line, {
                    "error": "terminate", "exception": "", "message": m["message"].strip()[:300],
                    "thrown": True})]
            self._terminate.fields["message"] = m["message"].strip()[:300]
            self._terminate = None
            return []
        who = line.who
        held = self._open.get(who)
        if held is not None and self._continue(held, text):
            return []
        c = text[0]
        if c == "t" and (m := _TERMINATE.match(text)):
            f = {"error": "terminate", "exception": m["type"] or "", "message": m["bare"] or ""}
            s = Signal("error_line", NAME, UNKNOWN, line, f)
            if m["type"]:
                self._terminate = s
            return [s]
        if c == "F" and (m := _FATAL.match(text)):
            # processes that failed at one moment tear each other's line (faulthandler
            # writes it in pieces): "Fatal Python error: Fatal Python error: AbortedAborted"
            # is two errors, each "Aborted"
            message, k = _untorn(m["message"])
            return [self._hold(who, Signal("error_line", NAME, UNKNOWN, line, {
                "error": "fatal", "exception": "Fatal Python error",
                "message": message[:300]})) for _ in range(k)]
        if (c in "SABIF" or ": line " in text[:300]) and (m := _SHELL_SIGNAL.match(text)):
            return [Signal("error_line", NAME, UNKNOWN, line,
                           {"error": "signal", "exception": m["message"], "message": ""})]
        if "ignal" in text or "*** " in text:
            if m := _NATIVE_SIGNAL.search(text):
                what = m["what"] or m["sig"] or m["what2"] or "a fatal signal"
                return [Signal("error_line", NAME, UNKNOWN, line,
                               {"error": "signal", "exception": what.strip(), "message": ""})]
        if (c.isalpha() or c == "_") and ("rror" in text or "xception" in text
                                          or "ailure" in text):
            m = _EXC.match(text)
            if m and not _NOT_ERRORS.search(m["type"]):
                return [Signal("error_line", NAME, UNKNOWN, line,
                               {"error": "exception", "exception": m["type"],
                                "message": (m["message"] or "").strip()[:300]})]
        return []

    def _hold(self, who, s: Signal) -> Signal:
        if len(self._open) >= MAX_OPEN:
            self._open.pop(next(iter(self._open)))
        self._open[who] = s
        return s

    def _continue(self, held: Signal, text: str) -> bool:
        """A line that completes the held signal: what() of a terminate, a user frame of a
        fatal error. Anything else closes it (the process printed on)."""
        f = held.fields
        if f["error"] == "fatal" and torn_piece(text):
            # its dump and another process' tore each other's lines (dumps.py): no frame
            # from here on is known to be its own
            f["torn"] = True
            return True
        if f["error"] == "fatal" and (m := _FAULT_FRAME.match(text)):
            lineno = small_int(m["line"])
            if ("where" not in f and not f.get("torn") and lineno is not None
                    and not _LIBRARY.search(m["file"])):
                f["where"] = {"file": m["file"], "line": lineno, "function": m["function"]}
            return True
        if f["error"] == "fatal" and text.startswith(("Current thread", "Thread 0x",
                                                      "Extension modules")):
            return True
        self._open.pop(next(k for k, v in self._open.items() if v is held), None)
        return False
