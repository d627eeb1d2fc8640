"""What a log can make the reader search, parse or hold, bounded: a log is anyone's text.

- `searched(text)`: the part of a message the families' regexes see. A message can be 4 MiB
  long (a line with no newline); what the families read in it is at its start (the error,
  its type, its numbers) or at its end (what a cut or a redraw left last), so a long one
  is searched in its first and last few KiB only. Each regex then costs a bounded amount
  per line, whatever its shape (the rules are linear too: tests/security/test_log_hostile.py).
- `small_int(digits)`: a number as the rules read it, or None past 18 digits. No rank, pid,
  sequence number or size has more; int() of over 4,300 digits raises ValueError, and a
  number that long means nothing anyway.
- `MAX_TRACKED`: distinct processes (ranks, local ranks, pids) whose lines are counted one
  by one; the lines of processes past it are counted together, and the read line says so.
- `shown(finding)`: a finding made of a log's words, as every output shows it (`--json`,
  findings.json, the terminal): each string with its control characters stripped and its
  length bounded (safetext.printable, as the text report prints a summary), each list and
  object bounded, numbers JSON can write.
"""

from __future__ import annotations

import math

from distdoctor.findings import Finding
from distdoctor.safetext import printable

MAX_SEARCHED = 8 << 10  # characters of one message the families search
_HEAD = 6 << 10  # ... its first ones
_TAIL = MAX_SEARCHED - _HEAD  # ... and its last ones
CUT = " [...] "  # what stands for the middle left out
MAX_DIGITS = 18  # a number's digits (10**18 - 1 fits in 63 bits)
MAX_TRACKED = 1 << 17  # processes tracked one by one (the biggest jobs have 10**5 ranks)
# a job's ranks: a rank number or world size past this in a log is no job's (a mangled
# label, a made-up line), and no rule counts up to it
MAX_RANKS = 1_000_000


def searched(text: str) -> str:
    """`text` itself, or for a message longer than MAX_SEARCHED its head and tail with
    CUT between them."""
    if len(text) <= MAX_SEARCHED:
        return text
    return text[:_HEAD] + CUT + text[-_TAIL:]


def every_rank(lo: int, hi: int) -> range:
    """The ranks lo..hi-1, which a rule fills in where a log shows some of them (ranks are
    numbered without gaps); none where `hi` is past MAX_RANKS. A number a log spells must
    not make the reader count to it: "nRanks 999999999999" or a label "[rank1099511627776]"
    held it for minutes, building every rank below."""
    return range(lo, hi) if hi <= MAX_RANKS else range(0)


def small_int(text: str | bytes | None) -> int | None:
    """The int `text` spells (an optional sign, then digits), or None where it spells none
    or has more than MAX_DIGITS digits."""
    if text is None:
        return None
    s = text.strip()
    digits = s[1:] if s[:1] in ("-", "+", b"-", b"+") else s
    if not 0 < len(digits) <= MAX_DIGITS or not digits.isdigit():
        return None
    try:
        return int(s)
    except ValueError:  # digits isdigit() accepts that int() does not ("²")
        return None


MAX_TEXT = 2000  # characters of a finding's summary or remedy (the text report's own bound)
MAX_DETAIL = 500  # ... of a string among its details
MAX_STACK = 20_000  # ... of a stack
MAX_ITEMS = 4096  # items of a list or an object among its details
MAX_DEPTH = 8


def shown(f: Finding) -> Finding:
    """`f` with every string it carries printable and bounded (in place; returned)."""
    f.summary = printable(f.summary, MAX_TEXT)
    if f.remedy is not None:
        f.remedy = printable(f.remedy, MAX_TEXT)
    if f.group is not None:
        f.group = printable(f.group, MAX_DETAIL)
    f.callsites = [_bounded(c, 1) for c in f.callsites[:MAX_ITEMS]]
    f.stacks = {printable(k, MAX_DETAIL): printable(v, MAX_STACK, keep_newlines=True)
                for k, v in list(f.stacks.items())[:MAX_ITEMS]}
    f.details = _bounded(f.details, 0)
    return f


def _bounded(v, depth: int):
    """A detail's value, bounded: strings printable, containers cut, numbers finite."""
    if v is None or isinstance(v, (bool, int)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else None
    if isinstance(v, str):
        return printable(v, MAX_DETAIL)
    if depth >= MAX_DEPTH:
        return None
    if isinstance(v, dict):
        return {printable(k, MAX_DETAIL) if isinstance(k, str) else k: _bounded(x, depth + 1)
                for k, x in list(v.items())[:MAX_ITEMS]}
    if isinstance(v, (list, tuple, set, frozenset)):
        items = sorted(v, key=str) if isinstance(v, (set, frozenset)) else v
        return [_bounded(x, depth + 1) for x in list(items)[:MAX_ITEMS]]
    return printable(str(v), MAX_DETAIL)
