"""Where the ranks parted: the first op at which their paths stopped lining up.

Step 1 of four (align.py, branch.py, blame.py, parted.py). A mismatch or a hang shows
where the ranks' ops finally disagree; the cause is often earlier. A helper that calls
`barrier()` on one rank only pairs its barrier with the others' next one (barriers are
alike), and the ops disagree one or more ops later, at an innocent line. So after a
failure, and only then (healthy code issues the same op from different lines on
different ranks all the time: a rank-0 branch that broadcasts what the others receive,
pipeline stages), each side's recent ops on the group are aligned by call site: the
file, the line, the framework frame that issued it for that line and the user's frames
that called it (tracer/callsite.py). The parting is the first op one side issued that
the other has no counterpart for, or the first pair that differs with nothing lined up
after it. Ranks that issue one op from two lines and line up again right after did not
part there. Also here: the job's rhythm (what it issued after the same ops before) and
its familiar call sites, which blame.py weighs beside the branch that split the ranks
(branch.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from distdoctor.diagnosis.mismatches.mismatch import signature
from distdoctor.findings import callsite_of, site_phrase, site_text
from distdoctor.runlog.reader import Event

HISTORY = 128  # ops remembered per rank (every group), for this reasoning only
# alignment costs: the same site is a match; the same op from another line nearly one (a
# rank-0 branch); different ops cost more than one op left out, less than two
SAME_OP, OTHER_OP, GAP = 0.75, 1.75, 1.0
RHYTHM = 6  # the most ops before the parting matched against the job's earlier ops


def site(ev: Event) -> tuple:
    """The call site as the alignment compares it: file, line, the framework's line that
    issued the op for it (one `trainer.fit` line issues a barrier and a gather) and the
    callers' lines."""
    cs = ev.callsite or {}
    fw = cs.get("framework") or {}
    return (cs.get("file"), cs.get("line"), (fw.get("file"), fw.get("line")),
            tuple((c.get("file"), c.get("line")) for c in cs.get("callers") or ()))


def on_group(history, group: str, upto_seq: int) -> list[Event]:
    """A rank's collectives on `group` up to `upto_seq`, one per seq, in order."""
    by_seq = {ev.seq: ev for ev in history
              if ev.kind == "collective" and ev.group == group and ev.seq <= upto_seq}
    return [by_seq[s] for s in sorted(by_seq)]


def before(history, group: str, seq: int) -> list[Event]:
    """A rank's collectives on `group` before seq `seq`, in order."""
    return on_group(history, group, seq - 1)


def _key(ev: Event) -> tuple:
    return ev.op, site(ev)


def rhythm(ops: list[Event], pool: list[list[Event]]) -> set | None:
    """What the job issued next, earlier, after the ops that end `ops`: the (op, site)
    keys that followed the longest run of its last ops (up to RHYTHM) found earlier in
    any sequence of `pool`; None when not even its last op was seen before."""
    mine = [_key(e) for e in ops]
    seqs = [[_key(e) for e in p] for p in pool]
    for k in range(min(RHYTHM, len(mine)), 0, -1):
        tail = mine[-k:]
        found = {keys[j] for keys in seqs for j in range(k, len(keys))
                 if keys[j - k:j] == tail}
        if found:
            return found
    return None


def fits(ev: Event | None, ops: list[Event], pool: list[list[Event]]) -> bool | None:
    """Whether `ev` is what the job issued after `ops` before (rhythm); None unknown."""
    expected = rhythm(ops, pool)
    return None if ev is None or expected is None else _key(ev) in expected


@dataclass
class Parting:
    how: str  # "extra": `ours` has no counterpart; "missing": `theirs` has none; "differ"
    ours: Event | None  # the culprit side's op there (None: it issued none)
    theirs: Event | None  # the other side's
    after: Event | None  # the last op both issued alike before it (None: none seen)
    next_ours: Event | None = None  # what each went on to (the op after the parting)
    next_theirs: Event | None = None


def _align(a: list[Event], b: list[Event]) -> tuple[tuple[int | None, int | None], ...]:
    """Needleman-Wunsch over call sites: the columns (i, j), a gap being None."""
    return _columns(tuple(map(site, a)), tuple(map(site, b)),
                    tuple(map(signature, a)), tuple(map(signature, b)))


@lru_cache(maxsize=64)
def _columns(sa: tuple, sb: tuple, ga: tuple, gb: tuple) -> tuple:
    """The alignment of two sequences of (site, signature). Cached: a hang's finding is
    rebuilt every tick while it lasts, and the ops before it do not change."""
    n, m = len(sa), len(sb)
    cost = [[0.0] * (m + 1) for _ in range(n + 1)]
    for i in range(1, n + 1):
        cost[i][0] = i * GAP
    for j in range(1, m + 1):
        cost[0][j] = j * GAP

    def pair(i, j):
        if sa[i] == sb[j] and ga[i] == gb[j]:
            return 0.0
        return SAME_OP if ga[i] == gb[j] else OTHER_OP

    for i in range(1, n + 1):
        for j in range(1, m + 1):
            cost[i][j] = min(cost[i - 1][j - 1] + pair(i - 1, j - 1),
                             cost[i - 1][j] + GAP, cost[i][j - 1] + GAP)
    # Walked back from the ends; on a tie an op left over goes last (the side that is
    # behind has not issued it yet), taken from the side with more ops left
    cols = []
    i, j = n, m
    while i or j:
        up = i and cost[i][j] == cost[i - 1][j] + GAP
        left = j and cost[i][j] == cost[i][j - 1] + GAP
        if up and (not left or i >= j):
            cols.append((i - 1, None))
            i -= 1
        elif left:
            cols.append((None, j - 1))
            j -= 1
        else:
            cols.append((i - 1, j - 1))
            i, j = i - 1, j - 1
    return tuple(cols[::-1])


def parting(ours: list[Event], theirs: list[Event]) -> Parting | None:
    """Where `ours` (the culprit side's ops on a group) parted from `theirs`; None when
    the sequences line up to their ends (or there is nothing to compare)."""
    if not ours or not theirs:
        return None
    # start where both histories still hold the ops (each keeps its last HISTORY)
    start = max(ours[0].seq, theirs[0].seq)
    ours = [e for e in ours if e.seq >= start]
    theirs = [e for e in theirs if e.seq >= start]
    cols = _align(ours, theirs)

    def lined_up(col):
        i, j = col
        return i is not None and j is not None and signature(ours[i]) == signature(theirs[j])

    for k, (i, j) in enumerate(cols):
        if i is not None and j is not None:
            if lined_up((i, j)):
                continue  # the same op (from the same line, or another: a rank-0 branch)
            if any(lined_up(c) for c in cols[k + 1:]):
                continue  # one op from two lines, and in step again right after
            how = "differ"
        else:
            how = "extra" if j is None else "missing"
        before = [c for c in cols[:k] if c[0] is not None and c[1] is not None]
        rest_ours = [c[0] for c in cols[k + 1:] if c[0] is not None]
        rest_theirs = [c[1] for c in cols[k + 1:] if c[1] is not None]
        return Parting(how, None if i is None else ours[i], None if j is None else theirs[j],
                       ours[before[-1][0]] if before else None,
                       ours[rest_ours[0]] if rest_ours else None,
                       theirs[rest_theirs[0]] if rest_theirs else None)
    return None


def paired_from_two_lines(ours: list[Event], theirs: list[Event]) -> Parting | None:
    """The last pair of alike ops the two sides issued from different lines with no op
    from one line after it: where a stray barrier paired with the others' own barrier and
    the peer then left (nothing after it disagrees, so `parting` finds only the op left
    over at the end). None when every pair after the first lines up by site."""
    if not ours or not theirs:
        return None
    cols = _align(ours, theirs)
    found = None
    for k, (i, j) in enumerate(cols):
        if i is None or j is None or signature(ours[i]) != signature(theirs[j]):
            continue
        if site(ours[i]) == site(theirs[j]):
            found = None  # in step again after it
            continue
        before = [c for c in cols[:k] if c[0] is not None and c[1] is not None]
        rest_ours = [c[0] for c in cols[k + 1:] if c[0] is not None]
        found = Parting("differ", ours[i], theirs[j],
                        ours[before[-1][0]] if before else None,
                        ours[rest_ours[0]] if rest_ours else None, None)
    return found


def familiar(ev: Event | None, histories, before_seq: int) -> bool | None:
    """Whether the job issued a call like `ev` (op and site) before seq `before_seq` on
    its group, in the ranks' recent histories; None when they hold nothing that old."""
    if ev is None:
        return None
    key, old = (ev.op, site(ev)), False
    for history in histories:
        for e in history:
            if e.kind == "collective" and e.group == ev.group and e.seq < before_seq:
                old = True
                if (e.op, site(e)) == key:
                    return True
    return False if old else None


def describe(ev: Event | None) -> str:
    """'barrier #4 at utils.py:12 in ensure_on_disk (from train.py:40)', or 'barrier #4
    in Lightning's DDPStrategy.barrier, from trainer.fit at train.py:82'."""
    if ev is None:
        return "nothing"
    cs = ev.callsite or {}
    text = f"{ev.op} #{ev.seq}{site_phrase(cs, function=True)}"
    callers = cs.get("callers") or ()
    if callers:
        text += " (from " + ", from ".join(
            site_text(c) or f"?:{c.get('line')}" for c in callers[:2]) + ")"
    return text


def site_entry(rank: int, ev: Event) -> dict:
    """A finding's call-site entry for the op, with the line that called it."""
    entry = callsite_of(rank, ev.callsite)
    callers = (ev.callsite or {}).get("callers") or ()
    if callers:
        entry["called_from"] = {k: callers[0].get(k) for k in ("file", "line", "function")}
    if (ev.callsite or {}).get("thread_id"):
        entry["thread"] = ev.callsite.get("thread")
    return entry


def as_details(p: Parting, culprit: int, other: int) -> dict:
    """`details.parted_at`: each side's op and call site where the paths parted."""
    def side(rank, ev, nxt):
        out = {"rank": rank, "op": None if ev is None else ev.op,
               "seq": None if ev is None else ev.seq,
               "callsite": None if ev is None else site_entry(rank, ev)}
        if nxt is not None:
            out["then"] = {"op": nxt.op, "seq": nxt.seq, "callsite": site_entry(rank, nxt)}
        return out
    return {"how": p.how, "group": (p.ours or p.theirs).group,
            "culprit": side(culprit, p.ours, p.next_ours),
            "other": side(other, p.theirs, p.next_theirs),
            "after": None if p.after is None else {"op": p.after.op, "seq": p.after.seq}}
