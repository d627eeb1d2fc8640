"""The scanner: lines in, signals kept, findings out. Two users:

- `distdoctor run` feeds every line of the job's output as it is printed (`LogScanner.feed`,
  then `changed()` once per pass of its live loop);
- `distdoctor diagnose --log FILE...` reads whole logs (`scan_logs`), where the reader hands
  over only the lines that hold one of the families' anchors and counts the others.
"""

from __future__ import annotations

import re

from distdoctor.findings import Finding
from distdoctor.logs.bounds import MAX_SEARCHED, MAX_TRACKED, searched, shown
from distdoctor.logs.families import FAMILIES, ROUTES
from distdoctor.logs.families.context import assign_nccl_ranks
from distdoctor.logs.families.exceptions import Tracebacks
from distdoctor.logs.families.launcher import workers_stopped
from distdoctor.logs.families.progress import ProgressFamily
from distdoctor.logs.families.ray import assign_ranks
from distdoctor.logs.families.unknown import UnknownErrors
from distdoctor.logs.lines import LogLine, RankActivity, parse_raw
from distdoctor.logs.reasoning import Reasoner
from distdoctor.logs.signals import (
    CAUSE,
    CONTEXT,
    EXIT,
    TEARDOWN,
    TIMEOUT,
    UNKNOWN,
    VICTIM,
    Signal,
)

MAX_SIGNALS = 50_000   # a log of thousands of failing ranks keeps the first ones of each kind
MAX_PER_KIND = 4       # signals kept per (rule, process, problem)
# evidence (NCCL's world size and hosts, one line a rank at init) has half of MAX_SIGNALS: a
# log of a million ranks' init lines must leave room for the failure that follows them
MAX_CONTEXT = MAX_SIGNALS // 2
MAX_LINE_CHARS = 64 * 1024
# Which families read a line depends only on the anchors it holds, and an anchor with no digit
# is in a line exactly when it is in the line with its digits masked: lines that differ only
# in numbers (a rank, a sequence number, a time; a million ranks' identical timeouts) share
# one answer, remembered. Anchors with a digit are tested on every line.
# (masked in the line's UTF-8 bytes, where an ASCII anchor is exactly where it is in the text;
# bytes.translate is a tenth of str.translate's cost)
_DIGITS_MASKED = bytes.maketrans(b"0123456789", b"##########")
ROUTE_MEMORY = 4096  # answers remembered (then forgotten all at once)
ROUTE_MEMORY_CHARS = 1024  # longer lines are tested each time: the memory stays small
_FAILING = (CAUSE, TIMEOUT, VICTIM, EXIT, UNKNOWN)
# one alternation of every family's anchors: the live path's filter (faster than `in` each)
_ANCHOR_RE = re.compile("|".join(re.escape(a.decode())
                                 for a in sorted(ROUTES, key=len, reverse=True)))


def _no_digit(anchors: tuple[str, ...]) -> bool:
    return not any(c.isdigit() or c == "#" for a in anchors for c in a)


class LogScanner:
    """Scans lines one at a time and keeps what the reasoning needs, bounded."""

    def __init__(self):
        self.families = [cls() for cls in FAMILIES]
        self.tracebacks = Tracebacks()
        self.unknown = UnknownErrors()
        self.file_lines: dict[str, int] = {}  # lines read per file (the reader's count)
        self._routes = [(f, tuple(a.decode() for a in f.anchors)) for f in self.families]
        # NCCL's INFO lines (tens of thousands at init) only NCCL's own family and the
        # evidence read: the orchestrators' families never see them
        self._info_routes = [(f, a) for f, a in self._routes if not f.orchestrator]
        self.signals: list[Signal] = []
        self.activity: dict[tuple, RankActivity] = {}
        self.ranks_seen: set[int] = set()  # ranks known to exist (the live launcher's)
        self.dropped = 0
        self._context_kept = 0
        self._route_memory: dict[bytes, list] = {}
        # per family, its anchors with no digit (told by the masked line alone) and those
        # with one, each with its masked form (a line whose masked form lacks it cannot hold it)
        self._split = {f: (tuple(x for x in a if _no_digit((x,))),
                           tuple((x, x.encode().translate(_DIGITS_MASKED)) for x in a
                                 if not _no_digit((x,))))
                       for f, a in self._routes}
        self._kept: dict[tuple, int] = {}
        self._lineno = 0
        self._emitted: dict[str, dict] = {}
        self._dirty = False
        self.live = False  # fed line by line as a job prints (then a traceback may be open)
        self.mid_run = False  # the log starts mid-run (window.py): absence proves nothing
        self.repeats: list[Signal] = []  # a tail repeated with nothing moving (repeats.py)
        self.first_lines: dict[int, LogLine] = {}  # each finding's first line, by id

    # --- live ------------------------------------------------------------------------------
    def feed(self, text: str, rank: int | None = None) -> None:
        """One line of the job's output (`rank`: the launcher's, when it knows)."""
        self._lineno += 1
        self.file_lines[""] = self._lineno
        self.live = True
        for line in parse_raw(text[:MAX_LINE_CHARS], lineno=self._lineno, rank=rank):
            self._count(line)
            # a traceback's last line may hold no anchor ("...BackendCompilerFailed: ...")
            if _ANCHOR_RE.search(line.text) or self.tracebacks.holds(line.who):
                self.feed_line(line)

    def changed(self) -> list[Finding]:
        """The findings that are new or changed since the last call."""
        if not self._dirty:
            return []
        self._dirty = False
        out = []
        for f in map(shown, self.findings()):  # a log's words, as every output shows them
            sig = f.details.get("signature", f.summary)
            j = f.to_json()
            if self._emitted.get(sig) != j:
                self._emitted[sig] = j
                out.append(f)
        return out

    def _count(self, line: LogLine) -> None:
        who = line.who
        if who is None:
            return
        a = self.activity.get(who)
        if a is None:
            if len(self.activity) >= MAX_TRACKED:
                return
            a = self.activity[who] = RankActivity(first_lineno=line.lineno, first_file=line.file,
                                                   file=line.file)
        a.lines += 1
        a.last_lineno = line.lineno
        a.last_text = line.text[:300]

    # --- both ------------------------------------------------------------------------------
    def feed_line(self, line: LogLine) -> None:
        """A line that holds an anchor: every family reads it, the first that knows it wins."""
        if line.text.startswith("#") and line.who is None and line.lineno <= 40:
            return  # a fixture's or a user's comment block heading the file, not output
        if len(line.text) > MAX_SEARCHED:  # the families read its head and tail (bounds.py)
            line.text = searched(line.text)
        claimed: list[Signal] = []
        text = line.text
        for fam, anchors in self._readers(text):
            if anchors is None or any(map(text.__contains__, anchors)):
                claimed = fam.feed(line)
                if claimed:
                    break
        causes = [s for s in claimed if s.role != CONTEXT]
        in_traceback = self.tracebacks.holds(line.who)
        found = claimed + self.tracebacks.feed(line, causes)
        if not found and not in_traceback:
            found = self.unknown.feed(line)  # an error line nothing above knows
        elif claimed:
            self.unknown.claimed(line)
        for s in found:
            self._keep(s)

    def _readers(self, text: str) -> list[tuple]:
        """(family, None) for each family whose anchors `text` holds, in route order, and
        (family, anchors) where that is still to test (an anchor with a digit in it)."""
        key = (text.encode("utf-8", "surrogatepass").translate(_DIGITS_MASKED)
               if len(text) <= ROUTE_MEMORY_CHARS else None)
        found = self._route_memory.get(key) if key is not None else None
        if found is None:
            routes = self._info_routes if "NCCL INFO" in text else self._routes
            # a family reads only the lines that hold one of its own anchors
            # (map: no Python frame per anchor)
            found = []
            for f, a in routes:
                plain, digital = self._split[f]
                if any(map(text.__contains__, plain)):
                    found.append((f, None))
                elif digital and key is None:
                    if any(a in text for a, _ in digital):
                        found.append((f, None))
                elif digital:  # left to test per line: those the masked line may hold
                    maybe = tuple(a for a, m in digital if m in key)
                    if maybe:
                        found.append((f, maybe))
            if key is not None:
                if len(self._route_memory) >= ROUTE_MEMORY:
                    self._route_memory.clear()
                self._route_memory[key] = found
        return found

    def _keep(self, s: Signal) -> None:
        f = s.fields
        key = (s.rule, s.line.who, f.get("seq"), f.get("rank"), f.get("local_rank"),
               f.get("root_cause"), f.get("pid") if s.role == TEARDOWN else None)
        n = self._kept.get(key, 0)
        context = s.role == CONTEXT
        if (n >= MAX_PER_KIND or len(self.signals) >= MAX_SIGNALS
                or (context and self._context_kept >= MAX_CONTEXT)):
            self.dropped += 1
            return
        self._kept[key] = n + 1
        self._context_kept += context
        s.order = len(self.signals)
        self.signals.append(s)
        self._dirty = True

    def findings(self) -> list[Finding]:
        progress = next(f.recent for f in self.families if isinstance(f, ProgressFamily))
        signals = list(self.signals)
        # what the log ends in the middle of; live, an open traceback is one still printing
        for fam in self.families if self.live else [*self.families, self.tracebacks]:
            for s in fam.pending():
                s.order = len(signals)
                signals.append(s)
        if not any(s.role in _FAILING for s in signals):  # what is left to say, last
            for s in self.repeats + workers_stopped(signals):
                s.order = len(signals)
                signals.append(s)
        assign_ranks(signals)  # Ray workers' pids -> ranks, where the log tells
        assign_nccl_ranks(signals)  # ... and NCCL's processes, from its transport lines
        reasoner = Reasoner(signals, self.activity, self.ranks_seen, progress, self.file_lines)
        reasoner.mid_run = self.mid_run
        found = reasoner.findings()
        self.first_lines = reasoner.first_lines  # for the story's reading (ending.py)
        if self.dropped:
            for f in found:
                f.details["signals_dropped"] = self.dropped
        return found

    def read_summary(self, lines: int) -> str:
        ranks = {w[1] for w in self.activity if w and w[0] == "rank"}
        procs = len(self.activity)
        who = (f"{len(ranks)} rank{'s' if len(ranks) != 1 else ''}" if ranks
               else f"{procs} process{'es' if procs != 1 else ''}" if procs
               else "no rank-labelled lines")
        return f"{lines:,} lines from {who}"
