"""Evidence of work going on: progress bars and the "Map:"/"Running tokenizer" lines of
serial preprocessing. The last one each process printed shows a rank that was busy while
the others waited in a collective (its own lines may carry no rank prefix)."""

from __future__ import annotations

import re
from collections import deque

from distdoctor.logs.lines import LogLine
from distdoctor.logs.signals import Family, Signal

NAME = "progress"
_PROGRESS = re.compile(r"\d+%\|.*?\|\s*\d+/\d+|\b(?:Running tokenizer|Tokeniz|Map(?: \(num_proc="
                       r"\d+\))?:|Filter|Generating \w+ split|Loading checkpoint shards|"
                       r"Preprocessing)", re.I)
MAX_PROCESSES = 100_000
KEEP = 32  # recent progress lines per process: enough to tell a bar that moved from a redraw


class ProgressFamily(Family):
    """Keeps the recent progress lines of each process; never makes a signal."""

    name = NAME
    anchors = (b"%|", b"it/s]", b"s/it]", b"examples/s", b"Map", b"okeniz", b"Preprocessing",
               b"checkpoint shards")

    def __init__(self):
        self.recent: dict[object, deque[LogLine]] = {}

    def feed(self, line: LogLine) -> list[Signal]:
        if _PROGRESS.search(line.text):
            q = self.recent.get(line.who)
            if q is None and len(self.recent) < MAX_PROCESSES:
                q = self.recent[line.who] = deque(maxlen=KEEP)
            if q is not None:
                q.append(line)
        return []
