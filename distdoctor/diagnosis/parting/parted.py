"""A mismatch or a hang said at its root: where the ranks parted, who strayed, and why.

Step 4 of four, the words. The detectors name the op where the ranks' disagreement shows
(mismatch.py, hang.py); align.py finds where the ranks' recent ops parted, branch.py the
statement of the program that split them, blame.py who strayed; this module rewrites the
finding around them: its summary ("rank 0 entered `if rank == 0:` (train.py:15) and
issued all_reduce #1 ...; rank 1 did not enter it and went on to barrier #1 ..."),
`details.parted_at` with each side's op and call site, `details.branch` with the
branch's line, condition and the arm each side took, the culprit's line first among the
call sites. Two user threads on the failing group make it that race (threads.py). Where
nothing tells who strayed, the finding says it is a tie and blames nobody.
"""

from __future__ import annotations

from distdoctor.diagnosis.mismatches import threads as T
from distdoctor.diagnosis.parting import align as D
from distdoctor.diagnosis.parting import blame, direction, order
from distdoctor.diagnosis.parting import branch as B
from distdoctor.diagnosis.parting.branch import Branch
from distdoctor.diagnosis.rendezvous import Rendezvous
from distdoctor.findings import Finding, callsite_of, who


def _race(f: Finding, ranks, histories) -> Finding | None:
    """The failure explained as one group used from two user threads, if it was: the
    group had ops from two user threads of a rank, and the ranks' ops at the failing
    collective came from different threads (a failure elsewhere on such a group, a rank
    stuck in compute, say, is not the race)."""
    # the ranks run one program: a torch thread seen beside the main thread on one rank
    # is the same thread on the others
    seen_beside = any(T.beside_main(histories.get(r, ()), f.group) for r in ranks)
    at, beside = set(), dict.fromkeys(ranks, seen_beside)
    for r in ranks:
        for ev in histories.get(r, ()):
            if ev.kind == "collective" and ev.group == f.group and ev.seq == f.seq:
                at.add(T.key_of(ev, beside[r]))
    if len(at) < 2:
        return None
    used = {}
    for r in ranks:
        seen = T.threads_on(histories.get(r, ()), f.group, seen_beside)
        if len(seen) > 1:
            used[r] = seen
    if not used:
        return None
    r, seen = next(iter(sorted(used.items())))
    f.details["ranks_in_order"] = sorted(f.ranks)  # who the op's vote named
    f.ranks = sorted(used)  # each of these ranks races its own threads on the group
    desc = f" ({f.details.get('group_desc')})" if f.details.get("group_desc") else ""
    f.details["threads_share_group"] = {
        str(rank): [T.where(ev, beside.get(rank, False)) for ev in s.values()]
        for rank, s in sorted(used.items())}
    f.details["reason"] = "threads_share_group"
    f.summary = (f"group {f.group}{desc} is used from {len(seen)} threads of "
                 f"{who(used)}: {' and '.join(T.where(ev, beside[r]) for ev in seen.values())}; the "
                 f"order of collectives across threads is not defined, so the ranks issued "
                 f"them in different orders. It showed as: {f.summary}")
    thread_sites = [{**callsite_of(r, ev.callsite), "thread": T.label_of(ev, beside[r])}
                    for ev in seen.values()]
    f.callsites = thread_sites + [c for c in f.callsites if (c.get("file"), c.get("line"))
                                  not in {(t["file"], t["line"]) for t in thread_sites}]
    f.remedy = T.REMEDY
    return f


def _sentence(p: D.Parting, subject: str, others: str, skipped: bool = False) -> str:
    """What happened at the parting, said of `subject` ("rank 2", "ranks 2, 3"), the side
    that strayed (`skipped`: it left out the op the others are in and went on). Used where
    no branch was read; with one, _branch_words says it."""
    be = "is" if others.startswith("rank ") else "are"
    if p.how == "differ" and skipped:
        return (f"{subject} skipped {D.describe(p.theirs)}, which {others} {be} in, and "
                f"went on to {D.describe(p.ours)}")
    if p.how == "extra":
        text = f"{subject} issued {D.describe(p.ours)}, which {others} never issued"
        if p.next_theirs is not None:
            text += f" ({others} issued {D.describe(p.next_theirs)} there)"
    elif p.how == "missing":
        text = f"{subject} skipped {D.describe(p.theirs)}, which {others} issued"
        if p.next_ours is not None:
            text += f", and went on to {D.describe(p.next_ours)}"
    else:
        text = f"{subject} issued {D.describe(p.ours)} where {others} issued {D.describe(p.theirs)}"
    return text


def _culprit_sites(p: D.Parting, culprit: int, other: int) -> list[dict]:
    """The call sites at the parting (each with the line that called it), then where the
    culprit went on to."""
    out = []
    for rank, ev, at_parting in ((culprit, p.ours, True), (other, p.theirs, True),
                                 (culprit, p.next_ours, False)):
        if ev is None or not ev.callsite:
            continue
        out.append(D.site_entry(rank, ev))
        if at_parting:  # the lines that called it, innermost first
            out += [{"rank": rank, **{k: c.get(k) for k in ("file", "line", "function")},
                     "role": "caller"} for c in ev.callsite.get("callers") or ()]
    return out


def _merge_sites(first: list[dict], rest: list[dict]) -> list[dict]:
    seen, out = set(), []
    for c in first + rest:
        key = (c.get("rank"), c.get("file"), c.get("line"))
        if key not in seen:
            seen.add(key)
            out.append(c)
    return out


def _judged(p: D.Parting, a_side: list[int], b_side: list[int], histories, group, seq,
            majority: bool):
    """The verdict on the parting between side a (`p.ours`) and side b, and the parting
    seen from the side that strayed (its op first), with that side's ranks."""
    a, b = a_side[0], b_side[0]
    verdict = blame.judge(p, a, b, histories, majority)
    if verdict.side == 1:  # the parting seen from the other side
        p = D.parting(D.on_group(histories.get(b, ()), group, seq),
                      D.on_group(histories.get(a, ()), group, seq)) or p
        if verdict.branch is not None:
            verdict.branch.flip()
        return verdict, p, b_side, a_side
    return verdict, p, a_side, b_side


def _branch_words(br: Branch, p: D.Parting, subject: str, others: str) -> str:
    """'rank 0 entered `if rank == 0:` (train.py:15) and issued all_reduce #1 at
    train.py:16 in buggy; rank 1 did not enter it and went on to barrier #1 at
    train.py:23 in main'."""
    def then(ev, nxt):
        if ev is not None:
            return f" and issued {D.describe(ev)}"
        return f" and went on to {D.describe(nxt)}" if nxt is not None else " and issued nothing more"
    return (f"{subject} {br.said(0)}{then(p.ours, p.next_ours)}; "
            f"{others} {br.said(1, 'it')}{then(p.theirs, p.next_theirs)}")


def _say_branch(f: Finding, br: Branch | None, sides: list[list[int]],
                unreadable: str | None = None) -> None:
    """details.branch, and the branch's line (and the way out a side took) among the call
    sites, after the ops'."""
    if unreadable:
        f.details["source_unreadable"] = unreadable
    if br is None:
        return
    f.details["branch"] = br.as_details(sides)
    entry = {"rank": sides[0][0], "file": br.file, "line": br.line, "function": br.function,
             "role": "branch"}
    took = next((k for k in (0, 1) if br.left[k]), None)
    exits = ([{**entry, "rank": sides[took][0], "line": br.exit_line, "role": "exit"}]
             if br.exit_line is not None and took is not None else [])
    f.callsites = _merge_sites(f.callsites, [entry, *exits])


def explain_mismatch(f: Finding, rv: Rendezvous, histories: dict,
                     span_of=None) -> Finding:
    """Rewrite a mismatch at `rv` around where the ranks parted (see the module doc).
    `span_of(event)`: the step an op was issued in, to say the parting's."""
    if _race(f, rv.arrivals, histories) is not None:
        return f
    variants = f.details.get("variants") or []
    if len(variants) < 2 or rv.is_p2p:
        return f
    sizes = sorted((len(v["ranks"]) for v in variants), reverse=True)
    majority = sizes[0] > sizes[1]
    main = variants[0]["ranks"]
    odd = [r for v in variants[1:] for r in v["ranks"]] if majority else variants[1]["ranks"]
    p = D.parting(D.on_group(histories.get(odd[0], ()), rv.group, rv.seq),
                  D.on_group(histories.get(main[0], ()), rv.group, rv.seq))
    if p is None:
        return f
    verdict, p, side, rest = _judged(p, odd, main, histories, rv.group, rv.seq, majority)
    culprit, other = side[0], rest[0]
    if not majority:
        f.details["evidence"] = verdict.why
        if verdict.side is None:
            return _tie(f, p, culprit, other, verdict,
                        "" if _at_failure(p, rv) else f". It showed at #{rv.seq}", histories)
        f.ranks = sorted(side)  # the whole side that strayed (an even split: its ranks)
    main = rest
    others = (f"rank {other}" if len(main) == 1 else
              f"ranks {', '.join(map(str, sorted(main)))}" if not majority else "the others")
    f.details["parted_at"] = D.as_details(p, culprit, other)
    _say_branch(f, verdict.branch, [side, rest], verdict.unreadable)
    if _at_failure(p, rv) and majority and verdict.branch is None:
        return f  # the op that disagrees is where they parted: the summary says it
    skipped = verdict.skipped
    # the step of the parting: the other side's where the culprit skipped its op and went
    # on (into its next step, maybe), else the culprit's
    step = span_of((p.theirs if skipped else p.ours) or p.theirs or p.ours) if span_of else None
    if step:
        f.details["span"] = step
    where = (p.ours or p.theirs)
    subject = who(f.ranks) if f.ranks else f"rank {culprit}"
    said = (_branch_words(verdict.branch, p, subject, others) if verdict.branch is not None
            else _sentence(p, subject, others, skipped))
    lead = f"{subject} parted from {others} at {where.op} #{where.seq} in group {rv.group}: {said}"
    if not majority:
        lead += f" ({verdict.why})"
    if f.details.get("span"):  # the step it happened in, as the user counts it
        lead += f", in {f.details['span']}"
    f.summary = lead + ("" if _at_failure(p, rv) else f". It showed at #{rv.seq}: {f.summary}")
    f.callsites = _merge_sites(_culprit_sites(p, culprit, other),
                               [c for c in f.callsites if c.get("rank") == culprit]
                               + [c for c in f.callsites if c.get("rank") != culprit])
    return f


def _last_exchange(f: Finding, histories: dict) -> Finding:
    """An unmatched send/recv: the culprit's own last exchange with the waiting rank (its
    batch, which lacked the matching op) goes with its line. Where that exchange's line
    never held the matching op in the job, nothing says the peer dropped it: the waiting
    rank's op is the one with no counterpart (a batch list built with one op too many)."""
    culprit = f.ranks[0]
    unmatched = f.details.get("unmatched") or {}
    peer = unmatched.get("rank")
    last = None
    for ev in histories.get(culprit, ()):
        if ev.kind == "p2p" and ev.peer_global == peer:
            last = ev
    if last is None and "last_exchange" not in f.details:
        return _wrong_peer(f, histories, culprit, peer)
    if last is None or "last_exchange" in f.details:
        return f
    f.details["last_exchange"] = {"op": last.op, "seq": last.seq,
                                  "callsite": D.site_entry(culprit, last)}
    wanted = "send" if "recv" in (unmatched.get("op") or "") else "recv"
    matched_before = any(ev.kind == "p2p" and ev.peer_global == peer and wanted in ev.op
                         and D.site(ev) == D.site(last) for ev in histories.get(culprit, ()))
    waiting = next((ev for ev in reversed(histories.get(peer, ())) if ev.kind == "p2p"
                    and ev.peer_global == culprit and ev.seq == f.seq), None)
    if not matched_before and waiting is not None:
        return _waiter_to_blame(
            f, peer, f"rank {culprit}'s exchange at {D.describe(last)} never held a {wanted} "
                     f"to rank {peer} in this job",
            f"rank {peer}'s {D.describe(waiting)} has no counterpart: rank {culprit}'s "
            f"exchange with it ({D.describe(last)}) never held a {wanted} to rank {peer} in "
            f"this job, and rank {culprit} went on", [D.site_entry(peer, waiting)])
    f.summary += (f"; rank {culprit}'s last exchange with rank {peer} was "
                  f"{D.describe(last)}, without the matching op")
    f.callsites = _merge_sites([D.site_entry(culprit, last)], f.callsites)
    return f


def _wrong_peer(f: Finding, histories: dict, named: int, waiter: int) -> Finding:
    """The waiter's op names a rank that never exchanged with it in the job, while a third
    waits in the matching op towards it: the waiter named the wrong peer."""
    mine = next((ev for ev in reversed(histories.get(waiter, ())) if ev.kind == "p2p"
                 and ev.peer_global == named and ev.seq == f.seq), None)
    if mine is None:
        return f
    wanted = "send" if "recv" in mine.op else "recv"
    for r in sorted(histories):
        last = next((ev for ev in reversed(histories[r]) if ev.kind == "p2p"), None)
        if r in (named, waiter) or last is None or last.t_end_ns is not None \
                or last.peer_global != waiter or wanted not in last.op:
            continue
        return _waiter_to_blame(
            f, waiter, f"rank {named} never exchanged with rank {waiter} in this job; rank "
                       f"{r} waits in a {wanted} to it",
            f"rank {waiter}'s {D.describe(mine)} names rank {named}, which never exchanged "
            f"with it in this job, while rank {r} waits in {D.describe(last)} to rank "
            f"{waiter}: rank {waiter}'s op names the wrong peer",
            [D.site_entry(waiter, mine), D.site_entry(r, last)])
    return f


def _waiter_to_blame(f: Finding, waiter: int, evidence: str, said: str, sites: list) -> Finding:
    f.ranks = [waiter]  # the unmatched p2p's waiting rank is the culprit
    f.details["evidence"] = evidence
    f.summary = f"{said}. It showed as: {f.summary}"
    f.callsites = _merge_sites(sites, f.callsites)
    return f


def _skipped_branch(f: Finding, culprit: int, other: int, histories: dict) -> Finding:
    """A rank that went past a collective it never issued on the group (so no ops of its
    there to align): the branch between where it is and the others' collective."""
    ops = [ev for ev in histories.get(culprit, ()) if ev.kind in ("collective", "p2p")]
    mine = ops[-1] if ops else None
    # its own op before: the others ran the same code up to there too (they issued what
    # it did, or its peer's side of it)
    before = ops[-2] if len(ops) > 1 else None
    theirs = next((ev for ev in histories.get(other, ()) if ev.kind == "collective"
                   and ev.group == f.group and ev.seq == f.seq), None)
    waiting = f.details.get("waiting_ranks") or [other]
    br, unreadable = B.read(before, mine, theirs)
    _say_branch(f, br, [[culprit], waiting], unreadable)
    if br is not None:
        f.summary += (f": rank {culprit} {br.said(0)}; {who(waiting)} {br.said(1, 'it')} and "
                      f"issued {D.describe(theirs)}")
    return f


def _tie(f: Finding, p: D.Parting, a: int, b: int, verdict, tail: str,
         histories: dict) -> Finding:
    """No majority and no evidence: both sides, rank order, equal weight; nobody blamed.
    The summary says how the two ops differ and the branch that split them, if read."""
    sides = sorted([(a, p.ours, p.next_ours), (b, p.theirs, p.next_theirs)],
                   key=lambda s: s[0])
    where = p.ours or p.theirs
    f.ranks = []
    f.details["tie"] = [a, b] if a < b else [b, a]
    f.details["parted_at"] = D.as_details(p, a, b)
    _say_branch(f, verdict.branch, [[a], [b]], verdict.unreadable)
    loop = order.loop_of(p, (histories.get(a, ()), histories.get(b, ())))
    if loop is not None:  # one line, two ops: the order is the finding
        f.details["order"] = loop
        f.details["evidence"] = "the same line issued different collectives inside a loop"
        f.summary = order.sentence(loop, a, b, p) + tail
        f.remedy = ("Make every rank issue the loop's collectives in one order: iterate "
                    "sorted(...) rather than a set or a dict built from one, or gather the "
                    "names first and agree on them.")
        f.callsites = _merge_sites([D.site_entry(a, p.ours), D.site_entry(b, p.theirs),
                                    {"rank": a, "file": loop["file"], "line": loop["line"],
                                     "role": "loop"}], f.callsites)
        return f
    differs = f.details.get("differs_in") or []
    how = f" they differ in {', '.join(differs)};" if differs else ""
    split = ""
    if verdict.branch is not None:
        br = verdict.branch
        split = f" rank {a} {br.said(0)}, rank {b} {br.said(1, 'it')};"
    f.summary = (f"ranks {sides[0][0]} and {sides[1][0]} parted at collective #{where.seq} "
                 f"in group {where.group}, and it is a tie ({verdict.why}):{split}{how} "
                 + "; ".join(f"rank {r} issued {D.describe(ev)}" if ev is not None else
                             f"rank {r} went on to {D.describe(nxt)}" for r, ev, nxt in sides)
                 + (f", in {f.details['span']}" if f.details.get("span") else "") + tail)
    sites = []
    for r, ev, nxt in sides:
        sites += _culprit_sites(D.Parting(p.how, ev, None, None, nxt), r, r)
    f.callsites = _merge_sites(sites, f.callsites)
    return f


def _at_failure(p: D.Parting, rv: Rendezvous) -> bool:
    return p.how == "differ" and (p.ours or p.theirs).seq == rv.seq


# findings whose op is a send or receive, not the group's n-th collective (they say both
# sides' lines themselves)
_NOT_ON_GROUP = ("unmatched_p2p", "wrong_peer", "dropped_send")


def explain_hang(f: Finding, histories: dict) -> Finding:
    """A hang (or a rank left alone in a collective) said from where the culprit's path
    parted from the others' on the group, when that was before the op it shows at."""
    if f.details.get("reason") == "unmatched_p2p" and f.ranks:
        return _last_exchange(f, histories)
    if f.kind == "deadlock":  # a two-rank p2p cycle: the side that broke the order
        return direction.judge(f, histories)
    if (not f.ranks or f.group is None or f.seq is None or "parted_at" in f.details
            or f.details.get("reason") in _NOT_ON_GROUP):
        return f
    others = (f.details.get("exited_ranks") or f.details.get("waiting_ranks")
              or f.details.get("failed_ranks") or [])
    involved = [*f.ranks, *others]
    if _race(f, involved, histories) is not None:
        return f
    others = [r for r in others if r not in f.ranks]
    if not others:
        return f
    culprit, other = f.ranks[0], others[0]
    ours = D.on_group(histories.get(culprit, ()), f.group, f.seq)
    theirs = D.on_group(histories.get(other, ()), f.group, f.seq)
    p = D.parting(ours, theirs)
    majority = len(set(involved)) != 2
    if (p is None or (p.ours or p.theirs).seq >= f.seq) and f.details.get("exited_ranks"):
        # the peer left: a stray op paired with one of its own from another line
        p = D.paired_from_two_lines(ours, theirs)
        if p is None or blame.judge(p, culprit, other, histories, majority).branch is None:
            return f
    if p is None and f.details.get("reason") == "skipped_collective":
        return _skipped_branch(f, culprit, other, histories)
    if p is None or (p.ours or p.theirs).seq >= f.seq:
        return f
    verdict, p, side, _ = _judged(p, [culprit], [other], histories, f.group, f.seq, majority)
    if not majority:  # no majority: the program decides, or it is a tie
        f.details["evidence"] = verdict.why
        if verdict.side is None:
            return _tie(f, p, culprit, other, verdict, f". It showed later: {f.summary}",
                        histories)
        if side[0] != culprit:
            culprit, other = other, culprit
            f.ranks = [culprit]
    f.details["parted_at"] = D.as_details(p, culprit, other)
    sides = [[culprit], [other] if not majority else others]
    _say_branch(f, verdict.branch, sides, verdict.unreadable)
    word = "the others" if len(others) > 1 else f"rank {other}"
    where = p.ours or p.theirs
    why = f" ({f.details['evidence']})" if f.details.get("evidence") else ""
    said = (_branch_words(verdict.branch, p, f"rank {culprit}", word)
            if verdict.branch is not None else
            _sentence(p, f"rank {culprit}", word, verdict.skipped))
    f.summary = (f"rank {culprit} parted from {word} at {where.op} #{where.seq} in group "
                 f"{f.group}: {said}{why}. It showed later: {f.summary}")
    f.callsites = _merge_sites(_culprit_sites(p, culprit, other), f.callsites)
    return f
