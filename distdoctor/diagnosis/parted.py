"""A mismatch or a hang said at its root: where the ranks parted, who strayed, and why.

The detectors name the op where the ranks' disagreement shows (mismatch.py, hang.py);
this module walks back through the ranks' recent ops (divergence.py) and rewrites the
finding around the parting: its summary, `details.parted_at` with each side's op and call
site, the culprit's line first among the call sites. Two user threads on the failing
group make it that race (threads.py). Where no majority names the culprit (two ranks, an
even split), the evidence decides or the finding says it is a tie and blames nobody.
"""

from __future__ import annotations

from distdoctor.diagnosis import divergence as D
from distdoctor.diagnosis import threads as T
from distdoctor.diagnosis.rendezvous import Rendezvous
from distdoctor.findings import Finding, callsite_of, who


def _race(f: Finding, ranks, histories) -> Finding | None:
    """The failure explained as one group used from two user threads, if it was: the
    group had ops from two user threads of a rank, and the ranks' ops at the failing
    collective came from different threads (a failure elsewhere on such a group, a rank
    stuck in compute, say, is not the race)."""
    at = set()
    for r in ranks:
        for ev in histories.get(r, ()):
            if ev.kind == "collective" and ev.group == f.group and ev.seq == f.seq:
                at.add(T.thread_label(ev))
    if len(at) < 2:
        return None
    used = {}
    for r in ranks:
        seen = T.threads_on(histories.get(r, ()), f.group)
        if len(seen) > 1:
            used[r] = seen
    if not used:
        return None
    r, seen = next(iter(sorted(used.items())))
    f.details["ranks_in_order"] = sorted(f.ranks)  # who the op's vote named: not a cause
    f.ranks = []  # every rank runs the racing threads: no rank is the odd one
    desc = f" ({f.details.get('group_desc')})" if f.details.get("group_desc") else ""
    f.details["threads_share_group"] = {
        str(rank): [T.where(ev) for ev in s.values()] for rank, s in sorted(used.items())}
    f.details["reason"] = "threads_share_group"
    f.summary = (f"group {f.group}{desc} is used from {len(seen)} threads of "
                 f"{who(used)}: {' and '.join(T.where(ev) for ev in seen.values())}; the "
                 f"order of collectives across threads is not defined, so the ranks issued "
                 f"them in different orders. It showed as: {f.summary}")
    thread_sites = [{**callsite_of(r, ev.callsite), "thread": T.thread_label(ev)}
                    for ev in seen.values()]
    f.callsites = thread_sites + [c for c in f.callsites if (c.get("file"), c.get("line"))
                                  not in {(t["file"], t["line"]) for t in thread_sites}]
    f.remedy = T.REMEDY
    return f


class _Sides:
    """A two-rank parting as the evidence reads it: rank a's op (`p.ours`) against rank
    b's (`p.theirs`), whether the job issued each before (`known`: familiar); for an op
    one side issued and the other did not, which side has it (`has`, `op`), which lacks
    it (`lacks`) and what that one went on to (`went`)."""

    def __init__(self, p: D.Parting, a: int, b: int, histories):
        self.p, self.a, self.b = p, a, b
        where = p.ours or p.theirs
        self.seq = where.seq
        self.pool = [histories.get(a, ()), histories.get(b, ())]
        self.ops = [D.before(h, where.group, self.seq) for h in self.pool]
        self.known = (D.familiar(p.ours, self.pool, self.seq),
                      D.familiar(p.theirs, self.pool, self.seq))
        self.looped = any(self.known)  # these ops were issued before: a loop came round
        extra = p.how == "extra"
        self.op = p.ours if extra else p.theirs
        self.op_known = self.known[0] if extra else self.known[1]
        self.has, self.lacks = (a, b) if extra else (b, a)
        self.went = p.next_theirs if extra else p.next_ours
        self.before = self.ops[0] if extra else self.ops[1]


def _by_rhythm(s: _Sides):
    """The side whose op is not the call the job made after the same calls before
    strayed (a loop's step: the rank at the earlier line may be an iteration ahead)."""
    p, a, b = s.p, s.a, s.b
    if p.how != "differ":
        fits, went_fits = D.fits(s.op, s.before, s.ops), D.fits(s.went, s.before, s.ops)
        if fits is True and went_fits is False:
            return s.lacks, (f"rank {s.has}'s {s.op.op} is the call the job made after the "
                             f"same calls before; rank {s.lacks} skipped it"), False
        if fits is False and went_fits is True:
            return s.has, (f"rank {s.lacks} went on to the call the job made after the same "
                           f"calls before; rank {s.has}'s {s.op.op} came in between"), False
        return None
    fa, fb = D.fits(p.ours, s.ops[0], s.ops), D.fits(p.theirs, s.ops[1], s.ops)
    if fa is fb or None in (fa, fb):
        return None
    strayed, kept = (b, a) if fa else (a, b)
    bad, good = (p.theirs, p.ours) if fa else (p.ours, p.theirs)
    skipped = D.fits(bad, [*(s.ops[0] if fa else s.ops[1]), good], s.ops) is True
    return strayed, (f"rank {kept}'s {good.op} is the call the job made after the same "
                     f"calls before; rank {strayed} "
                     + ("left it out and went on to the call after it" if skipped
                        else "made another")), skipped


def _by_history(s: _Sides):
    """A call site the job has issued before is the path, a new one the detour."""
    p, a, b = s.p, s.a, s.b
    if p.how != "differ":
        if s.op_known is True:
            return s.lacks, (f"rank {s.has}'s {s.op.op} is a call the job issued before; "
                             f"rank {s.lacks} skipped it"), False
        if s.op_known is False and D.familiar(s.went, s.pool, s.seq) is True:
            return s.has, (f"rank {s.has}'s {s.op.op} at that line is new to the job, while "
                           f"rank {s.lacks} went on to a call it issued before"), False
        return None
    ka, kb = s.known
    if ka is True and kb is False:
        return b, f"rank {a}'s call is one the job issued before, rank {b}'s is new", False
    if kb is True and ka is False:
        return a, f"rank {b}'s call is one the job issued before, rank {a}'s is new", False
    return None


def _by_position(s: _Sides):
    """A rank further along the same function skipped what the other is still in."""
    p, a, b = s.p, s.a, s.b
    if p.how != "differ":
        ahead = D.further_along(s.went, s.op, s.looped)
        if not ahead:
            return None
        strayed = s.lacks if ahead > 0 else s.has
        return strayed, f"rank {strayed} is further along the program", False
    ahead = D.further_along(p.ours, p.theirs, s.looped)
    if not ahead:
        return None
    strayed = a if ahead > 0 else b
    return strayed, (f"rank {strayed} is further along the program: it skipped what "
                     f"rank {b if strayed == a else a} is still in"), True


def _evidence(p: D.Parting, a: int, b: int, histories) -> tuple[int | None, str, bool]:
    """Which of ranks a (`p.ours`) and b (`p.theirs`) strayed, why, and whether it skipped
    the other's op and went on past it; (None, why not, False) when nothing tells."""
    sides = _Sides(p, a, b, histories)
    for rule in (_by_rhythm, _by_history, _by_position):
        verdict = rule(sides)
        if verdict is not None:
            return verdict
    return None, "nothing tells which rank strayed", False


def _sentence(p: D.Parting, subject: str, others: str, skipped: bool = False) -> str:
    """What happened at the parting, said of `subject` ("rank 2", "ranks 2, 3"), the side
    that strayed (`skipped`: it is further along, past an op the others are still in)."""
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
    a, b = odd[0], main[0]
    p = D.parting(D.on_group(histories.get(a, ()), rv.group, rv.seq),
                  D.on_group(histories.get(b, ()), rv.group, rv.seq))
    if p is None:
        return f
    culprit, other, skipped = a, b, False
    if not majority:
        strayed, why, skipped = _evidence(p, a, b, histories)
        f.details["evidence"] = why
        if strayed is None:
            return _tie(f, p, a, b, why,
                        "" if _at_failure(p, rv) else f". It showed at #{rv.seq}")
        side, rest = odd, main
        if strayed != a:  # the parting seen from the other side
            p = D.parting(D.on_group(histories.get(b, ()), rv.group, rv.seq),
                          D.on_group(histories.get(a, ()), rv.group, rv.seq)) or p
            culprit, other = b, a
            side, rest = main, odd
        f.ranks = sorted(side)  # the whole side that strayed (an even split: its ranks)
        main = rest
    others = (f"rank {other}" if len(main) == 1 else
              f"ranks {', '.join(map(str, sorted(main)))}" if not majority else "the others")
    f.details["parted_at"] = D.as_details(p, culprit, other)
    if _at_failure(p, rv) and majority:
        return f  # the op that disagrees is where they parted: the summary says it
    # the step of the parting: the other side's where the culprit skipped its op and went
    # on (into its next step, maybe), else the culprit's
    step = span_of((p.theirs if skipped else p.ours) or p.theirs or p.ours) if span_of else None
    if step:
        f.details["span"] = step
    where = (p.ours or p.theirs)
    subject = who(f.ranks) if f.ranks else f"rank {culprit}"
    lead = (f"{subject} parted from {others} at {where.op} #{where.seq} in group "
            f"{rv.group}: {_sentence(p, subject, others, skipped)}")
    if not majority:
        lead += f" ({f.details['evidence']})"
    if f.details.get("span"):  # the step it happened in, as the user counts it
        lead += f", in {f.details['span']}"
    f.summary = lead + ("" if _at_failure(p, rv) else f". It showed at #{rv.seq}: {f.summary}")
    f.callsites = _merge_sites(_culprit_sites(p, culprit, other),
                               [c for c in f.callsites if c.get("rank") == culprit]
                               + [c for c in f.callsites if c.get("rank") != culprit])
    return f


def _last_exchange(f: Finding, histories: dict) -> Finding:
    """An unmatched send/recv: the culprit's own last exchange with the waiting rank (its
    batch, which lacked the matching op) goes with its line."""
    culprit = f.ranks[0]
    peer = (f.details.get("unmatched") or {}).get("rank")
    last = None
    for ev in histories.get(culprit, ()):
        if ev.kind == "p2p" and ev.peer_global == peer:
            last = ev
    if last is None or "last_exchange" in f.details:
        return f
    f.details["last_exchange"] = {"op": last.op, "seq": last.seq,
                                  "callsite": D.site_entry(culprit, last)}
    f.summary += (f"; rank {culprit}'s last exchange with rank {peer} was "
                  f"{D.describe(last)}, without the matching op")
    f.callsites = _merge_sites([D.site_entry(culprit, last)], f.callsites)
    return f


def _tie(f: Finding, p: D.Parting, a: int, b: int, why: str, tail: str) -> Finding:
    """No majority and no evidence: both sides, rank order, equal weight; nobody blamed."""
    sides = sorted([(a, p.ours, p.next_ours), (b, p.theirs, p.next_theirs)],
                   key=lambda s: s[0])
    where = p.ours or p.theirs
    f.ranks = []
    f.details["tie"] = [a, b] if a < b else [b, a]
    f.details["parted_at"] = D.as_details(p, a, b)
    f.summary = (f"ranks {sides[0][0]} and {sides[1][0]} parted at collective #{where.seq} "
                 f"in group {where.group}, and it is a tie ({why}): "
                 + "; ".join(f"rank {r} issued {D.describe(ev)}" for r, ev, _ in sides)
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
    culprit, other, skipped = f.ranks[0], others[0], False
    p = D.parting(D.on_group(histories.get(culprit, ()), f.group, f.seq),
                  D.on_group(histories.get(other, ()), f.group, f.seq))
    if p is None or (p.ours or p.theirs).seq >= f.seq:
        return f
    if len(set(involved)) == 2:  # no majority: the evidence decides, or it is a tie
        strayed, why, skipped = _evidence(p, culprit, other, histories)
        f.details["evidence"] = why
        if strayed is None:
            return _tie(f, p, culprit, other, why, f". It showed later: {f.summary}")
        if strayed != culprit:
            culprit, other = other, culprit
            p = D.parting(D.on_group(histories.get(culprit, ()), f.group, f.seq),
                          D.on_group(histories.get(other, ()), f.group, f.seq)) or p
            f.ranks = [culprit]
    f.details["parted_at"] = D.as_details(p, culprit, other)
    word = "the others" if len(others) > 1 else f"rank {other}"
    where = p.ours or p.theirs
    why = f" ({f.details['evidence']})" if f.details.get("evidence") else ""
    f.summary = (f"rank {culprit} parted from {word} at {where.op} #{where.seq} in group "
                 f"{f.group}: {_sentence(p, f'rank {culprit}', word, skipped)}{why}. It showed later: "
                 f"{f.summary}")
    f.callsites = _merge_sites(_culprit_sites(p, culprit, other), f.callsites)
    return f
