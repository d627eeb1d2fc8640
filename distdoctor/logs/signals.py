"""What a family reads in one line: a `Signal`, the unit the cross-rank reasoning works on.

A signal says who printed it, what it means and what part it plays in the failure:

- CAUSE: a failure in its own right (an exception, an OOM, a port in use).
- TIMEOUT: a rank that waited and gave up; the culprit is a rank that never arrived.
- VICTIM: a rank that lost a peer (connection reset, remote error): the cause is elsewhere.
- EXIT: a launcher's report of a rank's exit (code or signal).
- TEARDOWN: the launcher stopping the survivors (SIGTERM): never a cause.
- BENIGN: a known-harmless line (NCCL plugin not found): info at most.
- CONTEXT: evidence for the reasoning (world size, last completed work), never a finding.
- UNKNOWN: an error line no family knows (families/unknown.py): a finding only where no
  family found an error (fallback.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from distdoctor.logs.bounds import small_int
from distdoctor.logs.lines import LogLine

CAUSE, TIMEOUT, VICTIM, EXIT, TEARDOWN, BENIGN, CONTEXT, UNKNOWN = (
    "cause", "timeout", "victim", "exit", "teardown", "benign", "context", "unknown")


@dataclass
class Signal:
    rule: str             # e.g. "cuda_oom"
    family: str           # e.g. "oom"
    role: str             # one of the roles above
    line: LogLine
    fields: dict = field(default_factory=dict)  # rule-specific values (op, seq, port, ...)
    order: int = 0        # position in the log, set by the scanner


@dataclass(frozen=True)
class Rule:
    """A one-line message family kept as data: how to spot it and what it means."""

    name: str
    family: str
    role: str
    pattern: re.Pattern
    ints: tuple[str, ...] = ()  # named groups converted to int


def rule(name: str, family: str, role: str, regex: str, ints: tuple[str, ...] = (),
         flags: int = 0) -> Rule:
    return Rule(name, family, role, re.compile(regex, flags), ints)


def short_of(words: str) -> str:
    """A lazy run of characters that stops short of the next `words` (a regex)."""
    return rf"(?:(?!{words}).)*?"


def then(words: str) -> str:
    """`then(X) + "Y"`: X, then Y with no other X between them. It matches where `X.*?Y`
    matches (the last X before a Y is followed by that Y with no X between), with the same
    Y, in one pass: searched as `X.*?Y`, every X starts a scan to the line's end (a line of
    X repeated costs its square); here each scan stops at the next X, so each character is
    scanned once. (Of two overlapping X, as "socket" in "NET/Socket" is not, the inner one
    may end the outer one's scan.)"""
    return rf"(?:{words}){short_of(words)}"


def fields_of(r: Rule, m: re.Match) -> dict:
    """The match's groups that matched, those named in `r.ints` as ints (one that is not a
    number, or too long to be one, is left out)."""
    out = {k: v for k, v in m.groupdict().items() if v is not None}
    for k in r.ints:
        v = out.get(k)
        if v is not None:
            n = small_int(v)
            if n is None:
                del out[k]
            else:
                out[k] = n
    return out


class Family:
    """A family of messages. Subclasses list `anchors` (byte strings one of which every line
    they read contains: the reader hands over only such lines) and implement `feed`."""

    name = ""
    anchors: tuple[bytes, ...] = ()
    rules: tuple[Rule, ...] = ()
    orchestrator = False  # a scheduler's or cluster's words (never in an NCCL INFO line)

    def pending(self) -> list[Signal]:
        """Signals of a report still open where the log ends (read, not consumed)."""
        return []

    def feed(self, line: LogLine) -> list[Signal]:
        """Signals of one line; the default tries `rules`, first match wins."""
        text = line.text
        for r in self.rules:
            m = r.pattern.search(text)
            if m:
                return [Signal(r.name, r.family, r.role, line, fields_of(r, m))]
        return []
