"""The exit statuses a launcher prints for its ranks, read from the job's output.

Under a wrapped launcher (`distdoctor run -- torchrun ...`) only the launcher's own exit
status is known to `run`; torchrun prints each failed rank's in its error summary:

    rank      : 0 (local_rank: 0)
    exitcode  : -6 (pid: 18537)

A rank that gloo aborted is then "killed by SIGABRT", not "died (exit status unknown)".
Bounded: one entry a rank.
"""

from __future__ import annotations

import re

_RANK = re.compile(r"^\s*rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)")
_EXIT = re.compile(r"^\s*exitcode\s*:\s*(-?\d+)\s*\(pid:\s*(\d+)\)")
_MAX_RANKS = 1 << 16


class LauncherReport:
    def __init__(self):
        self._rank: int | None = None
        self.exits: dict[int, tuple[int, int]] = {}  # rank -> (exit status, pid)

    def feed(self, text: str) -> None:
        try:
            m = _RANK.match(text)
            if m:
                self._rank = int(m.group(1))
                return
            m = _EXIT.match(text)
            if m and self._rank is not None and len(self.exits) < _MAX_RANKS:
                self.exits[self._rank] = (int(m.group(1)), int(m.group(2)))
                self._rank = None
        except Exception:
            pass
