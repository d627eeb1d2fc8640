"""The fallback finding: a log with an error line never ends in silence.

Where no family found an error (a cause, a timeout, a lost peer), the first error line no
family knows (families/unknown.py) is the finding, said as unknown: "rank 3 raised
CheckpointException: ... (not a known distributed-training failure; the first error in
this log)". First means first in time: by the log's own time stamps where every candidate
has one (glog heads, ISO stamps), else by position. Its rank comes from the line's prefix,
else from the launcher's report of the one rank that failed. Later errors of the same kind
on other ranks join it (its ranks); other later errors are its consequences.

A launcher's bare "rank R exited with code 1" is the same failure seen from outside: the
error line of that rank (or the one error line with no rank) replaces it and says why.

Quiet where the job went on: an error its process printed long before the end of a log
with no exit, timeout or lost peer is an `info` finding (a framework logged and carried
on), not an alarm.
"""

from __future__ import annotations

import re

from distdoctor.findings import Finding
from distdoctor.logs.families.launcher import how_it_ended
from distdoctor.logs.problems import Problem, clip, plural, rank_of, ranks_text, short_path
from distdoctor.logs.signals import TIMEOUT, VICTIM, Signal

WENT_ON_LINES = 50  # lines a process printed after an error for it to have carried on
REMEDY = ("distdoctor has no rule for this error: start from it (the first error in time) "
          "and its lines below; the errors after it are most often its consequences.")
_NUM = re.compile(r"0x[0-9a-f]+|\d+")
_MONTHS = re.compile(r"(\d{4})-(\d\d)-(\d\d)[ T](\d\d:\d\d:\d\d)(?:[.,](\d+))?")
_GLOG_TIME = re.compile(r"(\d{3,4}) (\d\d:\d\d:\d\d)(?:\.(\d+))?")


def time_key(when: str | None) -> str | None:
    """A time stamp as printed, as a string that sorts in time ("MMDD HH:MM:SS.ffffff"):
    ISO stamps and glog heads alike (glog has no year; neither is needed within a job)."""
    if not when:
        return None
    m = _MONTHS.search(when)
    if m:
        return f"{m[1]}{m[2]}{m[3]} {m[4]}.{(m[5] or '').ljust(9, '0')[:9]}"
    m = _GLOG_TIME.search(when)
    if m:
        return f"????{m[1].zfill(4)} {m[2]}.{(m[3] or '').ljust(9, '0')[:9]}"
    return None


def first_in_time(signals: list[Signal]) -> Signal:
    keys = [time_key(s.line.when) for s in signals]
    if all(keys) and len({k[:4] == "????" for k in keys}) == 1:
        return min(zip(keys, signals, strict=True), key=lambda t: (t[0], t[1].order))[1]
    return min(signals, key=lambda s: s.order)


def fallback_cause(ctx, unknown: list[Signal], out: list) -> None:
    """Adds the fallback finding to `out` (order, finding) where no family found an error."""
    if not unknown:
        return
    errors = [(o, f) for o, f in out if f.severity == "error"]
    if any(f.details.get("rule") != "rank_exit" for _, f in errors):
        return  # a family knows the cause: it wins
    waiting = {r for p in ctx.problems.values() if p.role in (TIMEOUT, VICTIM) for r in p.ranks}
    # errors printed by ranks that timed out or lost a peer are their report of it; with
    # such ranks in the log, an error that names no rank may be theirs too
    candidates = [s for s in unknown if rank_of(s.line) is not None
                  and rank_of(s.line) not in waiting] if waiting else unknown
    if ctx.exits or any(p.role in (TIMEOUT, VICTIM) for p in ctx.problems.values()):
        # the launcher's own traceback, cut off, is its report of what the ranks saw (or
        # of the exit it reported: accelerate-launch's torchrun, "failed (exitcode: 1)
        # local_rank: 7", then its traceback): the exit is the finding, not the traceback
        candidates = [s for s in candidates if not (s.fields.get("error") == "cut"
                                                    and s.fields.get("in_launcher"))]
    if not candidates:
        return
    first = first_in_time(candidates)
    same = [s for s in candidates if _same(s, first)]
    p = Problem("unknown", "unknown_error", "cause", ("unknown", first.fields["exception"]))
    for s in same:
        p.add(s)
    ranks = sorted(p.ranks)
    exit_e = _exit_of(ctx, ranks, [f for _, f in errors])
    family = "unknown"
    if exit_e is not None:
        ranks = ranks or [exit_e["rank"]]
        gone = [f for _, f in out if f.details.get("rule") == "rank_exit"
                and exit_e["rank"] in f.ranks]
        family = gone[0].details.get("family", family) if gone else family
        out[:] = [(o, f) for o, f in out if not any(f is g for g in gone)]
    elif errors:
        return  # the exits found are other ranks': this error is not theirs
    quiet = exit_e is None and not waiting and not ctx.exits and _went_on(ctx, same)
    f = ctx.finding(p, "crash", "info" if quiet else "error",
                    _summary(first, ranks, exit_e, quiet), ranks, REMEDY)
    f.details["family"] = family  # the launcher's, where its report is what is known
    where = first.fields.get("where")
    if where:
        f.callsites = [{"rank": r, **where} for r in ranks[:8]]
        f.details["where"] = where
    if first.line.when:
        f.details["time"] = first.line.when.strip(" []\t")
    later = [s for s in unknown if s is not first and not _same(s, first)][:20]
    if later:
        f.details["consequences"] = [
            {"rule": "unknown_error", "summary": clip(_what(s), 200),
             "reporting_ranks": [r] if (r := rank_of(s.line)) is not None else [], "count": 1}
            for s in later]
    out.append((first.order, f))


def _same(a: Signal, b: Signal) -> bool:
    fa, fb = a.fields, b.fields
    return (fa["exception"] == fb["exception"]
            and _NUM.sub("N", fa["message"])[:120] == _NUM.sub("N", fb["message"])[:120])


def _exit_of(ctx, ranks: list[int], errors: list[Finding]) -> dict | None:
    """The launcher's exit this error explains: its rank's, or the one exit found when the
    error names no rank (never a SIGKILL: that comes from outside the process)."""
    exits = [ctx.exits[r] for f in errors for r in f.ranks if r in ctx.exits]
    if ranks:
        exits = [e for e in exits if e["rank"] in ranks]
    exits = [e for e in exits if e.get("signum") != 9]
    return exits[0] if len(exits) == 1 or (exits and ranks) else None


def _went_on(ctx, signals: list[Signal]) -> bool:
    """Every process that printed it printed many more lines afterwards."""
    for s in signals:
        r = rank_of(s.line)
        a = ctx.ev.of_rank(r) if r is not None else ctx.ev.activity.get(s.line.who)
        if a is not None and a.file == s.line.file:
            last = a.last_lineno
        else:
            last = ctx.file_lines.get(s.line.file, 0)
        if last <= s.line.lineno + WENT_ON_LINES:
            return False
    return True


def _what(s: Signal) -> str:
    f = s.fields
    msg = f": {clip(f['message'], 160)}" if f.get("message") else ""
    where = f.get("where")
    at = (f" at {short_path(where['file'])}:{where['line']} in {where['function']}"
          if where else "")
    if f["error"] == "terminate":
        if f.get("thrown"):  # its what() line alone
            return f"aborted: terminate called after throwing an exception{msg}"
        if not f["exception"]:  # "without an active exception", "recursively"
            return f"aborted: terminate called {f['message']}"
        return f"aborted: terminate called after throwing an instance of '{f['exception']}'{msg}"
    if f["error"] == "fatal":
        torn = (" (its stack dump and another process' tore each other's lines, so where it "
                "stood is not read)" if f.get("torn") and not where else "")
        return f"died: Fatal Python error{msg}{at}{torn}"
    if f["error"] == "signal":
        return f"died: {f['exception']}"
    if f["error"] == "cut":
        src = f" ({where['source']})" if where and where.get("source") else ""
        return f"printed a traceback the log cuts off before its exception line{at}{src}"
    return f"raised {f['exception']}{msg}{at}"


def _summary(first: Signal, ranks: list[int], exit_e: dict | None, quiet: bool) -> str:
    who = f"rank{plural(ranks)} {ranks_text(ranks)} " if ranks else "a process "
    ended = f" and {how_it_ended(exit_e)}" if exit_e else ""
    note = ("(not a known distributed-training failure; its process went on afterwards)"
            if quiet else "(not a known distributed-training failure; the first error in "
                          "this log)")
    return f"{who}{_what(first)}{ended} {note}"
