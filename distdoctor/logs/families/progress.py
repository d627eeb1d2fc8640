"""Evidence of work going on: progress bars and the "Map:"/"Running tokenizer" lines of
serial preprocessing. The last one each process printed shows a rank that was busy while
the others waited in a collective (its own lines may carry no rank prefix)."""

from __future__ import annotations

import re
from collections import deque

from distdoctor.logs.bounds import searched
from distdoctor.logs.decoded import open_log
from distdoctor.logs.lines import LogLine
from distdoctor.logs.signals import Family, Signal

NAME = "progress"
# (a bar's percentage starts where digits start, and its bar runs to the next "|": tqdm
# draws none inside it)
_PROGRESS = re.compile(r"(?<!\d)\d{1,3}%\|[^|]*\|\s*\d+/\d+|"
                       r"\b(?:Running tokenizer|Tokeniz|Map(?: \(num_proc=\d+\))?:|Filter|Generating \w+ split|Loading checkpoint shards|"
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


# a training step's report: "step 30 | loss 2.41", "iter 200: loss 3.1", "Epoch 1 ... loss=",
# HF's "{'loss': 2.3, ...}"
_STEP = re.compile(r"\b(?:step|iter(?:ation)?|epoch|global_step|it)\b\W{0,3}\d{1,18}(?!\d)"
                   r".{0,200}?\bloss\b"
                   r"|['\"]loss['\"]\s*:\s*-?[\d.]", re.I)
_STEP_ANCHOR = b"loss"


def is_step_report(text: str) -> bool:
    """Whether `text` reports a training step (a step or epoch number, and a loss)."""
    return _STEP_ANCHOR in text.lower().encode() and bool(_STEP.search(searched(text)))


def trained_before(line: LogLine, limit: int = 2_000_000) -> bool:
    """Whether the file printed a training step's report before `line`: then a failure
    there came mid-run, not at start-up. Read again from the file only when a start-up
    failure is about to be said (a rare question), stopping at the first report found
    or at `limit` lines; False where the file cannot be read."""
    try:
        with open_log(line.file) as fh:  # (a .gz, UTF-16: as the reader read it)
            for n, raw in enumerate(fh, 1):
                if n >= min(line.lineno, limit):
                    return False
                if _STEP_ANCHOR in raw.lower() and _STEP.search(
                        searched(raw.decode("utf-8", "replace"))):
                    return True
    except (OSError, ValueError):
        return False
    return False
