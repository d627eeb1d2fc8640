"""Watchdog timeouts of one job, read together: the rank behind, and one finding for them all.

Ranks that time out on different sequence numbers of one group are out of step (a desync):
the ones on the higher number issued a collective the others never reached. A rank stuck
on an earlier number (it timed out there, or its last enqueued work is below the others')
is the rank behind; its own timeout is the same failure seen from its side, not a second
one. Timeouts that name no culprit at all are folded into the earliest.
"""

from __future__ import annotations

from distdoctor.logs.problems import plural, ranks_text

RULE = "watchdog_timeout"


def fold_stuck_ranks(out: list) -> list:
    """Timeouts reported only by ranks another timeout names as behind become part of it;
    with no enqueued work printed, the ranks stuck on a lower sequence number (and
    reporting nothing else) are the ones behind."""
    watchdog = [(o, f) for o, f in out if f.details.get("rule") == RULE]
    if len(watchdog) < 2:
        return out
    dropped: set[int] = set()
    for _, f in watchdog:
        if f.ranks or f.seq is None:
            continue
        mine = set(f.details.get("reporting_ranks", []))
        lower = [g for _, g in watchdog if g is not f and g.seq is not None and g.seq < f.seq
                 and not g.ranks and g.details.get("reporting_ranks")
                 and not mine & set(g.details["reporting_ranks"])]
        if lower:
            stuck = sorted({r for g in lower for r in g.details["reporting_ranks"]})
            f.ranks = stuck
            f.summary = f.summary.replace("; which rank never arrived is not in this log", "")
            f.summary += (f"; rank{plural(stuck)} {ranks_text(stuck)} never reached it: "
                          f"stuck on an earlier collective")
    for _, f in watchdog:
        if not f.ranks:
            continue
        for _, g in watchdog:
            rep = set(g.details.get("reporting_ranks", []))
            if g is f or id(g) in dropped or not rep or not rep <= set(f.ranks) or (
                    g.ranks and set(g.ranks) != rep):
                continue
            dropped.add(id(g))
            op = g.details.get("op")
            what = f"SeqNum {g.seq}" + (f" ({op})" if op else "")
            f.details.setdefault("consequences", []).append(
                {"rule": RULE, "summary": g.summary, "reporting_ranks": sorted(rep),
                 "count": g.details.get("count", 1)})
            f.details["stuck_on"] = {str(r): g.seq for r in sorted(rep)}
            f.summary += f" (rank{plural(rep)} {ranks_text(rep)} timed out on {what} instead)"
    return [(o, f) for o, f in out if id(f) not in dropped]


def one_unexplained_watchdog(out: list) -> list:
    """Watchdog timeouts of several sequence numbers that name no culprit (ranks stuck in
    different groups, or a log without group names) are one finding: the earliest, with the
    others listed, rather than one "not in this log" per number."""
    loose = [(o, f) for o, f in out if f.details.get("rule") == RULE and not f.ranks]
    if len(loose) < 2:
        return out
    (_, first), rest = loose[0], loose[1:]
    seqs = sorted({f.seq for _, f in rest if f.seq is not None} - {first.seq})
    reporting = sorted({r for _, f in loose for r in f.details.get("reporting_ranks", [])})
    first.details["other_seqs"] = seqs
    first.details["reporting_ranks"] = reporting
    first.summary = first.summary.replace(
        "; which rank", f" (and SeqNum {', '.join(map(str, seqs[:8]))} on ranks "
                        f"{ranks_text(reporting)}); which rank", 1)
    dropped = {id(f) for _, f in rest}
    return [(o, f) for o, f in out if id(f) not in dropped]
