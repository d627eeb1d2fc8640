"""Watchdog timeouts of one job, read together: the rank behind, and one finding for them all.

Ranks that time out on different sequence numbers of one group are out of step (a desync):
the ones on the higher number issued a collective the others never reached. Blame goes to
the minority: a few ranks stuck on an earlier number (they timed out there, or their last
enqueued work is below the others') are the ranks behind; a few ranks already on a later
number, while most wait on an earlier one, ran ahead out of step (a small broadcast lets
its root go on) and are the culprits, the waiting majority their victims. Either way the
culprits' own timeout is the same failure seen from their side, not a second one.
Timeouts that name no culprit at all are folded into the earliest.
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
            if mine and len(stuck) > len(mine):
                _out_of_step(f, sorted(mine), lower, dropped)
                continue
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


def _out_of_step(f, ahead: list[int], lower: list, dropped: set) -> None:
    """`f` (a timeout on a later sequence number, reported by the few ranks `ahead`) names
    them as the culprits; the majority's timeouts on earlier numbers (`lower`) become its
    consequences."""
    waiting = sorted({r for g in lower for r in g.details["reporting_ranks"]})
    g0 = min(lower, key=lambda g: g.seq)
    op = g0.details.get("op")
    them = "it" if len(ahead) == 1 else "they"
    f.ranks = ahead
    f.summary = f.summary.replace("; which rank never arrived is not in this log", "")
    f.summary += (f"; rank{plural(ahead)} {ranks_text(ahead)} out of step: {them} went on to "
                  f"SeqNum {f.seq} while rank{plural(waiting)} {ranks_text(waiting)} still wait "
                  f"in SeqNum {g0.seq}" + (f" ({op})" if op else "") +
                  f": {them} issued collectives the others never reached")
    f.details["out_of_step"] = {"ahead": ahead, "waiting": waiting, "seq": f.seq,
                                "waiting_seq": g0.seq}
    f.details["stuck_on"] = {str(r): g.seq for g in lower for r in g.details["reporting_ranks"]}
    for g in lower:
        dropped.add(id(g))
        f.details.setdefault("consequences", []).append(
            {"rule": RULE, "summary": g.summary, "reporting_ranks": g.details["reporting_ranks"],
             "count": g.details.get("count", 1)})
