"""A stall no rule names: the log ends in the same line over and over, and nothing moves.

A runtime that waits on something that never comes often says so on a timer: a scheduler's
"resource request cannot be scheduled", a framework's "waiting for N workers", a user's own
heartbeat thread printing the step it is stuck at. No family knows those words, and they are
INFO or WARNING lines, so without this the log reads as healthy until the timeout, if any.

Read from each file's tail (the last TAIL_BYTES), with the file's own prefixes peeled:

1. Each line becomes a template: clocks and durations masked as time, other numbers kept as
   values. Two lines are one repeat when the same process printed the same template.
2. The repeating tail is the longest end of the file made of repeats only: walking back from
   the end, it stops at a line that never recurs once what came after it already repeats.
3. It is a stall when the file's last line is one of them, a template in it repeats at least
   MIN_REPEATS times over MIN_SPAN_S or more, none of its values moves (a counter that moves
   is progress: "step 101", "step 102"), and it says it waits (a wait word) or it is a
   progress line whose counter stood still. Where the log shows no times, only a wait
   repeated MIN_REPEATS_UNTIMED times: unlabelled ranks all printing one farewell at the
   end of a healthy job repeat a line too.

Said only where no other failure is (scanner.py): a crash the waiting follows is the cause.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from distdoctor.logs.decoded import open_log
from distdoctor.logs.keys import sniff_file
from distdoctor.logs.lines import LogLine, parse_raw
from distdoctor.logs.signals import CAUSE, Signal

TAIL_BYTES = 256 << 10
MIN_REPEATS = 3
# where no clock tells how long they went on: more of them, and words that say it waits (the
# same farewell from 8 unlabelled ranks at the end of a healthy job is 8 repeats too)
MIN_REPEATS_UNTIMED = 10
MIN_SPAN_S = 2.0  # repeats printed at one moment are many processes, not a wait
MIN_SHARE = 0.8  # of the repeating tail's lines that belong to a template seen MIN_REPEATS
MAX_CHARS = 4096  # of a line templated (a line of digits must not cost its square)

# time: a clock, a date, a duration (60s, 1m13s, 1800000ms, "30 seconds"), a timedelta
_TIME = re.compile(
    r"\d{4}-\d\d-\d\d(?:[T ]\d\d:\d\d(?::\d\d(?:[.,]\d{1,9})?)?)?|\d?\d:\d\d:\d\d(?:[.,]\d{1,9})?|"
    r"\+?(?:\d{1,9}h)?(?:\d{1,9}m(?!s))?\d{1,9}(?:\.\d{1,9})?(?:ms|s)\b|"
    r"\d{1,9}(?:\.\d{1,9})?\s*(?:secs?|seconds?|mins?|minutes?|hours?|hrs?|ms|milliseconds?)\b")
# a count of tries moves while nothing else does
_TRIES = re.compile(r"\b(?:retry|retries|attempt|try|tries)\b\W{0,3}\d+(?:\s*/\s*\d+)?", re.I)
_HEX = re.compile(r"\b0x[0-9a-fA-F]+\b|\b[0-9a-f]{12,}\b")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_WAITS = re.compile(
    r"\b(?:wait(?:s|ing|ed)?|still|heartbeat|no progress|stuck|hang(?:s|ing)?|hung|cannot|"
    r"can't|not (?:yet )?ready|retry(?:ing)?|timed out|stall(?:s|ed)?|blocked)\b"
    r"(?!\s*[:=]\s*\d)", re.I)  # "Waiting: 0 reqs" is a gauge's label, not a wait
_PROGRESS = re.compile(r"\b(?:step|iter(?:ation)?|epoch|batch|global_step)\b\W{0,3}\d", re.I)
_DURATION = re.compile(r"(\d{1,9}(?:\.\d{1,9})?)\s*(ms|s|secs?|seconds?|mins?|minutes?|hours?|"
                       r"hrs?)\b|\+?(?:(\d{1,9})h)?(?:(\d{1,9})m(?!s))?(\d{1,9}(?:\.\d{1,9})?)s\b")
_CLOCK = re.compile(r"(\d?\d):(\d\d):(\d\d)")
_UNIT_S = {"ms": 0.001, "s": 1, "sec": 1, "secs": 1, "second": 1, "seconds": 1, "min": 60,
           "mins": 60, "minute": 60, "minutes": 60, "hour": 3600, "hours": 3600, "hr": 3600,
           "hrs": 3600}


@dataclass
class _Line:
    key: tuple           # (process, template)
    values: tuple        # the numbers that are neither time nor tries
    line: LogLine
    secs: float | None   # a clock's time of day, where the line shows one
    elapsed: float | None  # a duration the line states ("waited 120 s")


@dataclass
class Repeat:
    """One template the tail repeats: how often, over how long, as the log shows it."""

    first: LogLine
    last: LogLine
    count: int
    span_s: float | None


def template(text: str) -> tuple[str, tuple]:
    """A line's template and its values (the numbers that are neither time nor tries)."""
    t = _TIME.sub("<T>", text)
    t = _TRIES.sub("<TRY>", t)
    t = _HEX.sub("<X>", t)
    return _NUMBER.sub("<N>", t).strip(), tuple(_NUMBER.findall(t))


def _elapsed(text: str) -> float | None:
    best = None
    for m in _DURATION.finditer(text):
        if m[1]:
            s = float(m[1]) * _UNIT_S.get(m[2].lower(), 1)
        else:
            s = int(m[3] or 0) * 3600 + int(m[4] or 0) * 60 + float(m[5])
        best = s if best is None else max(best, s)
    return best


def _clock(line: LogLine, raw: str) -> float | None:
    m = _CLOCK.search(line.when or "") or _CLOCK.search(raw)
    return int(m[1]) * 3600 + int(m[2]) * 60 + int(m[3]) if m else None


_SNIFF = object()  # the head not given: sniffed here


def tail_lines(path: str, total: int | None = None, nbytes: int = TAIL_BYTES,
               head=_SNIFF) -> list[tuple[LogLine, str]]:
    """The parsed lines of the last `nbytes` of a file (its first, cut line dropped), each
    with the raw line it came from (a head the file taught may hold its only clock),
    numbered as in the file where its line count `total` is known. `head`: the one the
    reader learned from the file (else the file is sniffed again)."""
    if head is _SNIFF:
        head = sniff_file(path).head
    with open_log(path) as fh:
        if not fh.seekable():  # a .gz (decoded.py): no seeking back without reading it twice
            data, cut = b"", False
            while chunk := fh.read(8 << 20):
                cut = cut or len(data) + len(chunk) > nbytes
                data = (data + chunk)[-nbytes:]
        else:
            size = fh.seek(0, 2)
            fh.seek(max(0, size - nbytes))
            data, cut = fh.read(), size > nbytes
    if cut and b"\n" in data:
        data = data.split(b"\n", 1)[1]
    raws = data.decode("utf-8", "replace").splitlines()
    first = total - len(raws) + 1 if total and total >= len(raws) else 1
    out: list[tuple[LogLine, str]] = []
    for i, raw in enumerate(raws, first):
        if raw.strip():
            out.extend((ll, raw) for ll in parse_raw(raw, file=path, lineno=i, head=head)
                       if ll.text.strip())
    return out


def repeating_tail(lines: list[tuple[LogLine, str]]) -> list[Repeat]:
    """The templates a file's end repeats with nothing moving (see the module's steps):
    `lines` as tail_lines gives them."""
    seen: list[_Line] = []
    for ll, raw in lines:
        t, values = template(ll.text[:MAX_CHARS])
        raw = raw[:MAX_CHARS]
        seen.append(_Line((ll.who, t), values, ll, _clock(ll, raw), _elapsed(raw)))
    counts: Counter = Counter()
    once = 0  # keys seen once so far: while there are some, the tail still grows
    start = len(seen)
    for i in range(len(seen) - 1, -1, -1):
        k = seen[i].key
        if k not in counts and counts and once == 0:
            break  # a line that never recurs, after a tail that repeats: where it began
        counts[k] += 1
        once += 1 if counts[k] == 1 else -1 if counts[k] == 2 else 0
        start = i
    tail = seen[start:]
    if not tail:
        return []
    steady = {k for k, n in counts.items() if n >= MIN_REPEATS}
    if tail[-1].key not in steady or sum(counts[k] for k in steady) < MIN_SHARE * len(tail):
        return []  # (the log's last line must be the wait: a job that finished says so)
    out = []
    for k in dict.fromkeys(x.key for x in tail if x.key in steady):  # in the log's order:
        run = [x for x in tail if x.key == k]  # the same report whatever the hash seed
        if len({x.values for x in run}) > 1:
            return []  # a value moved: something progresses, nothing stalls
        text = run[0].line.text
        waits = _WAITS.search(text)
        if not (waits or _PROGRESS.search(text)):
            continue
        span = _span(run)
        if span is None and (len(run) < MIN_REPEATS_UNTIMED or not waits):
            continue
        if span is not None and span < MIN_SPAN_S:
            continue
        out.append(Repeat(run[0].line, run[-1].line, len(run), span))
    return out


def _span(run: list[_Line]) -> float | None:
    """How long the repeats went on: from their clocks, else the durations they state."""
    a, b = run[0].secs, run[-1].secs
    if a is not None and b is not None:
        return float((b - a) % 86400)
    e0, e1 = run[0].elapsed, run[-1].elapsed
    if e0 is not None and e1 is not None and e1 > e0:
        return e1 - e0
    return None


def stall_signals(files: list[str], file_lines: dict[str, int] | None = None,
                  heads: dict | None = None) -> list[Signal]:
    """One signal per template a file's tail repeats with nothing moving (`file_lines` and
    `heads`: the reader's line count and learned head per file, so no file is sniffed
    twice)."""
    out = []
    for path in files:
        try:
            lines = tail_lines(path, (file_lines or {}).get(path),
                               head=heads[path] if heads and path in heads else _SNIFF)
        except (OSError, EOFError):
            continue  # the reader has said what it could not read
        for r in repeating_tail(lines):
            out.append(Signal("repeat_wait", "stall", CAUSE, r.first, {
                "repeats": r.count, "waited": r.span_s, "text": r.last.text.strip()[:200]}))
    return out


def stall_signals_of_tails(tails: dict[str, list[tuple[LogLine, str]]]) -> list[Signal]:
    """`stall_signals` on tails already read and parsed (the story's: story.py), by file."""
    out = []
    for lines in tails.values():
        for r in repeating_tail(lines):
            out.append(Signal("repeat_wait", "stall", CAUSE, r.first, {
                "repeats": r.count, "waited": r.span_s, "text": r.last.text.strip()[:200]}))
    return out
