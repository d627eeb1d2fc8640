"""Who broke the order in a two-rank p2p cycle (issue 48, item 4).

Two ranks each blocked in a send to the other (or each in a receive from the other) wait
for each other. Said alone, that is a tie. The job often shows which side broke an order
the program keeps everywhere else:

- the other links: in a hand-written pipeline every link opens the same way (the
  upstream stage sends, the downstream one receives first). Where each completed opening
  of another link went one way along the ranks (lower to higher, or higher to lower),
  the side of the blocked link that did not open it that way broke the order;
- the link's own earlier exchanges: where both ranks' ops with each other before the
  block repeat with a period (steps, an evaluation pass), the side whose blocked op is
  not what its own rhythm gave at this place broke it, the other kept it.

Blame is said only where the evidence agrees and names one side, and never where both
blocked ops come from one line (the same code on both ranks: the program itself is
symmetric, and so is the tie: r25's 1F1B schedule, a halo exchange written with blocking
sends). Every word of the summary is a field of `details.direction`.
"""

from __future__ import annotations

from distdoctor.diagnosis.parting import align as D
from distdoctor.diagnosis.parting import branch as B
from distdoctor.findings import Finding, site_phrase

_KINDS = ("send", "recv")


def _p2p_with(history, peer: int) -> list:
    return [ev for ev in history if ev.kind == "p2p" and ev.op in _KINDS
            and ev.peer_global == peer]


def _whole(history) -> bool:
    """Whether the history still holds the rank's first ops (nothing dropped yet)."""
    maxlen = getattr(history, "maxlen", None)
    return maxlen is None or len(history) < maxlen


def _openings(histories: dict, skip: frozenset) -> list[dict]:
    """Each link but `skip` whose first exchange completed: who sent, who received."""
    out, seen = [], set()
    for u, hist in histories.items():
        if not _whole(hist):
            continue
        for ev in hist:
            v = ev.peer_global if ev.kind == "p2p" else None
            if v is None or v == u or frozenset((u, v)) in seen:
                continue
            seen.add(frozenset((u, v)))
            if frozenset((u, v)) == skip or v not in histories or not _whole(histories[v]):
                continue
            mine, theirs = _p2p_with(hist, v), _p2p_with(histories[v], u)
            if not mine or not theirs:
                continue
            a, b = mine[0], theirs[0]
            if {a.op, b.op} != set(_KINDS) or not (_alone(mine) and _alone(theirs)):
                continue
            if a.t_end_ns is None and b.t_end_ns is None:
                continue  # not yet exchanged: it says no order
            src, dst = (u, v) if a.op == "send" else (v, u)
            out.append({"from": src, "to": dst})
    return sorted(out, key=lambda o: (min(o["from"], o["to"]), o["from"]))


def _alone(ops: list) -> bool:
    """Whether the first op completed before the next on the link was posted: an order,
    not one of a batch posted together (batch_isend_irecv) whose order says nothing. A
    first op with nothing after it is alone too, done or not: a rank's completion can
    reach its log after its peer's (a loaded machine), and the peer's done op says the
    exchange took place."""
    if len(ops) < 2:
        return True
    first = ops[0]
    return first.t_end_ns is not None and first.t_end_ns <= ops[1].t_enter_ns


def _rhythm(ops: list) -> str | None:
    """The op the rank's earlier exchanges with its peer give at the place of its last
    one: the shortest period that their kinds repeat at least twice, read back one period."""
    kinds = [ev.op for ev in ops[:-1]]
    n = len(kinds)
    for period in range(1, n // 2 + 1):
        if all(kinds[i] == kinds[i - period] for i in range(period, n)):
            return kinds[n - period]
    return None


def _blocked(history, peer: int):
    ops = [ev for ev in history if ev.kind in ("collective", "p2p")]
    ev = ops[-1] if ops else None
    if ev is None or ev.kind != "p2p" or ev.op not in _KINDS or ev.peer_global != peer \
            or ev.t_end_ns is not None:
        return None
    return ev


def judge(f: Finding, histories: dict) -> Finding:
    """The deadlock `f` of two ranks, said as the one that broke the order where the
    other links or the link's own earlier exchanges show it; else `f` as it was."""
    if len(f.ranks) != 2 or f.details.get("reason"):
        return f
    a, b = f.ranks
    ea, eb = _blocked(histories.get(a, ()), b), _blocked(histories.get(b, ()), a)
    if ea is None or eb is None or ea.op != eb.op or ea.group != eb.group:
        return f
    if D.site(ea) == D.site(eb):
        return f  # one line on both ranks: the program is symmetric here
    op = ea.op
    votes: dict[int, list[str]] = {}
    evidence: dict = {"blocked": {str(a): op, str(b): op}}
    # the other links' openings, where the blocked ops open this one
    opens = _openings(histories, frozenset((a, b)))
    firsts = all(len(_p2p_with(histories.get(r, ()), p)) == 1 and _whole(histories.get(r, ()))
                 for r, p in ((a, b), (b, a)))
    ways = {o["from"] < o["to"] for o in opens}
    if opens and firsts and len(ways) == 1:
        up = min(a, b) if ways.pop() else max(a, b)  # who should send first on this link
        down = b if up == a else a
        broke = down if op == "send" else up
        evidence["other_links"] = {"opened": opens, "sender_first": up, "receiver_first": down}
        votes.setdefault(broke, []).append("other_links")
    # the link's own earlier exchanges
    rhythm = {}
    for r, p in ((a, b), (b, a)):
        want = _rhythm(_p2p_with(histories.get(r, ()), p))
        if want is not None:
            rhythm[r] = want
    if len(rhythm) == 2:
        off = [r for r in (a, b) if rhythm[r] != op]
        if len(off) == 1:
            evidence["earlier_exchanges"] = {str(r): rhythm[r] for r in (a, b)}
            votes.setdefault(off[0], []).append("earlier_exchanges")
    if len(votes) != 1:
        return f
    culprit, why = next(iter(votes.items()))
    other = b if culprit == a else a
    mine, theirs = (ea, eb) if culprit == a else (eb, ea)
    evidence.update(culprit=culprit, peer=other, decided_by=why)
    f.details["direction"] = evidence
    f.ranks = [culprit]
    f.group, f.seq = mine.group, mine.seq
    said = _sentence(culprit, other, op, mine, theirs, evidence)
    br = _arm(mine, theirs)
    if br is not None:  # the program's own arms: where the two ranks' code differs
        f.details["branch"] = br.as_details([[culprit], [other]])
        said += f" (rank {culprit} {br.said(0)}, rank {other} {br.said(1, 'it')})"
    f.summary = said + ". " + f.summary
    first = [c for c in f.callsites if c.get("rank") == culprit]
    f.callsites = first + [c for c in f.callsites if c.get("rank") != culprit]
    first, then = ("receive from", "sends to") if op == "send" else ("send to", "receives from")
    f.remedy = (f"Make rank {culprit} {first} rank {other} before it {then} it, as the "
                f"order kept elsewhere has it, or post the pair with isend/irecv "
                f"(batch_isend_irecv) and wait on both, so the order does not matter.")
    return f


def _arm(mine, theirs):
    """The branch on the rank's identity whose arms hold the two blocked ops, if read."""
    try:
        br, _ = B.read(None, mine, theirs)
    except Exception:  # the program's text is a help here, never a need
        return None
    return br if br is not None and br.kind == "rank" else None


def _sentence(culprit: int, other: int, op: str, mine, theirs, ev: dict) -> str:
    verb, undone = ("sends to", "receiving from") if op == "send" else \
        ("waits to receive from", "sending to")
    lead = (f"deadlock: rank {culprit} broke the order of its link with rank {other}: "
            f"it {verb} rank {other}{site_phrase(mine.callsite)} before {undone} it, "
            f"while rank {other} {verb} it{site_phrase(theirs.callsite)}")
    parts = []
    links = ev.get("other_links")
    if links:
        opened = ", ".join(f"{o['from']} → {o['to']}" for o in links["opened"])
        parts.append(f"every other link opens with the upstream rank's send ({opened}), "
                     f"so rank {links['sender_first']} sends first here and rank "
                     f"{links['receiver_first']} receives first")
    past = ev.get("earlier_exchanges")
    if past:
        did = {"send": "sent", "recv": "received"}
        parts.append(f"in their earlier exchanges on this link rank {culprit} "
                     f"{did[past[str(culprit)]]} at this point and rank {other} "
                     f"{did[past[str(other)]]}")
    return lead + ("; " + "; ".join(parts) if parts else "")
