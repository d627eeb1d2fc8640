"""hang and deadlock: collectives in flight too long, who never joined, and why.

A rendezvous is stuck when a rank has waited in it longer than the hang timeout. Each rank
blocked in a stuck rendezvous waits for the members that have not arrived: that is the
wait-for graph, across groups and p2p. Following it leads either to ranks that wait for
nothing (in compute, stuck outside any collective, or dead: the hang's culprits) or around
a cycle (a deadlock: e.g. two ranks each blocked in recv from the other, or a TP-group wait
against a DP-group wait). A cycle where one rank sits alone in a collective of one group
while every other rank of the cycle waits for it in another is a rank in the wrong group.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from distdoctor.diagnosis.hangs.progress import UNKNOWN, Policy, Verdict
from distdoctor.diagnosis.hangs.slow_past_timeout import slow_past_timeout
from distdoctor.diagnosis.hangs.waits import (
    all_joined_finding,
    dropped_sends,
    extra_collective,
    long_wait_finding,
    same_batch,
    same_call,
    skipped_finding,
    still_arriving,
    unmatched_p2p_finding,
    wrong_peer_finding,
)
from distdoctor.diagnosis.rendezvous import Rendezvous
from distdoctor.findings import Finding, callsite_of, error_text, site_phrase
from distdoctor.runlog.reader import Event


@dataclass
class RankView:
    """What the hang detector needs to know about one rank."""

    rank: int
    latest: Event | None  # newest op it issued
    last_done: Event | None  # newest op that completed
    now_ns: int | None  # the rank's clock now (estimated from its heartbeat)
    exit: str | None  # "exited with code 1", "killed by SIGKILL", or None while alive
    issued: dict[str, int]  # group -> collectives issued
    stopped: bool = False  # stopped by distdoctor: it was where it is when it was stopped
    clean_exit: bool = False  # it exited and its exit is not a failure (status 0, closed)
    exit_site: dict | None = None  # the line that ended it (a sys.exit, a raise), if known

    def waited_s(self, ev: Event) -> float:
        if self.now_ns is None:
            return 0.0
        return max(0.0, (self.now_ns - ev.t_enter_ns) / 1e9)


def _fmt_op(ev: Event) -> str:
    group = f"group {ev.group}" + (f" ({ev.group_desc})" if ev.group_desc else "")
    return f"{ev.op} #{ev.seq} in {group}{site_phrase(ev.callsite, full=True)}"


def where_is(view: RankView) -> str:
    """One phrase saying where a rank is: dead, waiting in an op, or outside any."""
    if view.exit:
        last = f"; its last op was {_fmt_op(view.latest)}" if view.latest else ""
        return f"{view.exit}{last}"
    ev = view.latest
    if ev is None:
        return "has issued no collective at all"
    if ev.t_end_ns is None:
        return f"is waiting in {_fmt_op(ev)} (for {view.waited_s(ev):.0f} s)"
    ago = ""
    if view.now_ns is not None and ev.t_end_ns:
        ago = f", {max(0.0, (view.now_ns - ev.t_end_ns) / 1e9):.0f} s ago"
    return f"is in no collective (last completed {_fmt_op(ev)}{ago})"


def _failed(rv: Rendezvous) -> list[int]:
    return sorted(r for r, e in rv.arrivals.items() if e.status in ("error", "timeout"))


def stuck_rendezvous(open_rv, views: dict[int, RankView], timeout_s: float) -> list[Rendezvous]:
    """Rendezvous in flight past the timeout, and those that failed with ranks missing
    (the transport gave up first: gloo's timeout, or a peer's exit reset the connection)."""
    out = []
    for rv in open_rv:
        # a dead rank's op stays "in flight" in its log forever: not a wait
        waited = max((views[r].waited_s(e) for r, e in rv.arrivals.items()
                      if e.t_end_ns is None and r in views
                      and (views[r].exit is None or views[r].stopped)), default=0.0)
        if waited >= timeout_s or (rv.missing and _failed(rv)):
            out.append(rv)
    return out


def _waits_for(open_rv, views: dict[int, RankView]) -> dict[int, tuple[Rendezvous, list[int]]]:
    """rank -> (the rendezvous it is blocked in, the ranks it waits for).

    A rank is blocked in its newest op while that op is in flight, however young: it is
    then not a culprit but a link in the chain. Older ops still in flight (async work) do
    not hold it.
    """
    edges: dict[int, tuple[Rendezvous, list[int]]] = {}
    for rv in open_rv:
        missing = rv.missing  # may be empty: blocked in a collective all have joined
        for rank, ev in rv.arrivals.items():
            view = views.get(rank)
            if (ev.t_end_ns is None and view is not None and view.latest is not None
                    and view.latest.index == ev.index and (view.exit is None or view.stopped)):
                edges[rank] = (rv, missing)
    return edges


def _cycles(edges: dict[int, tuple[Rendezvous, list[int]]]) -> list[list[int]]:
    """Strongly connected components with a cycle (Tarjan, iterative)."""
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    on_stack: set[int] = set()
    stack: list[int] = []
    out: list[list[int]] = []
    counter = 0
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(edges.get(start, (None, []))[1]))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, it = work[-1]
            advanced = False
            for nxt in it:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(edges.get(nxt, (None, []))[1])))
                    advanced = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    n = stack.pop()
                    on_stack.discard(n)
                    comp.append(n)
                    if n == node:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def hang_findings(open_rv, views: dict[int, RankView], policy: Policy | float,
                  skip_ranks: set[int] = frozenset(),
                  known: Callable[[Rendezvous], bool] = lambda rv: False,
                  familiar: Callable[[Event], bool | None] = lambda ev: True,
                  judge: Callable[[int, Rendezvous, float], Verdict] | None = None,
                  normal: Callable[[Rendezvous], float | None] = lambda rv: None
                  ) -> list[Finding]:
    """Hang, deadlock, wrong-group and long-wait findings for the rendezvous in flight.

    `policy`: the progress rule (progress.Policy) or a fixed timeout in seconds.
    `judge(rank, rv, waited_s)`: the verdict on a rank the others wait for, from its
    progress (engine); without one, the rank's progress is unknown.
    `normal(rv)`: the longest completed wait seen at this rendezvous' call site.
    `skip_ranks`: ranks already reported as crashed (the crash finding names who waits for
    them). `known(rv)`: True for rendezvous already explained (e.g. by a mismatch finding).
    `familiar(ev)`: whether a call like this one (op and line) was seen on its group before
    (None: no collective of the group has completed yet).
    """
    if not isinstance(policy, Policy):
        policy = Policy(float(policy))
    if judge is None:
        def judge(rank, rv, waited):
            return policy.judge(waited, UNKNOWN, None, False, normal(rv))
    open_rv = list(open_rv)
    if policy.auto:
        decided = None
    else:  # the fixed rule: only rendezvous in flight past the timeout are looked at
        decided = stuck_rendezvous(open_rv, views, policy.fixed_s)
        if not decided:
            return []
    edges = _waits_for(open_rv, views)
    findings: list[Finding] = []
    # a send dropped without wait(): its receiver waits for a message that never comes
    dropped, explained = dropped_sends(open_rv, views, policy)
    findings += dropped
    for r in explained:
        edges.pop(r, None)
    confirm = policy.confirm_s()
    stuck_ranks = ({r for rv in decided for r in rv.arrivals} if decided is not None
                   else None)
    in_cycle: set[int] = set()
    for comp in _cycles(edges):
        if stuck_ranks is not None:
            if not stuck_ranks & set(comp):
                continue  # a wait cycle younger than the timeout: not yet reported
        elif min(views[r].waited_s(edges[r][0].arrivals[r]) for r in comp) < confirm:
            continue  # every rank of it must have waited a moment (the logs lag)
        in_cycle.update(comp)
        found = _cycle_finding(comp, edges, views, familiar)
        if found is not None:  # (None: ranks on their way may yet tell who went past)
            findings.append(found)
    by_rv: dict[tuple, tuple[Rendezvous, list[int]]] = {}
    for rv in decided if decided is not None else open_rv:
        waiters = [r for r in _blocked(rv, views) if r not in explained]
        waited = max((views[r].waited_s(rv.arrivals[r]) for r in waiters), default=0.0)
        missing = rv.missing
        if not missing or known(rv):
            if decided is not None or (known(rv) and waited >= confirm) or (
                    waiters and waited >= policy.all_joined_bound(normal(rv))):
                if not (set(rv.arrivals) & explained):
                    findings.append(all_joined_finding(rv, views, known(rv)))
            continue
        roots = [r for r in missing if r not in edges and r not in skip_ranks]
        if not roots or set(missing) & in_cycle:
            continue
        if decided is None and not waiters and not _failed(rv):
            continue  # nobody is blocked in it (async work not waited yet)
        left = extra_collective(rv, roots, views, waited, confirm, familiar)
        if left is not None:
            findings.append(left)
            continue
        if _failed(rv) and decided is None:  # the job's timeout: the rank may be busy
            slow = slow_past_timeout(rv, roots, {r: judge(r, rv, waited) for r in roots}, views)
            if slow is not None:
                findings.append(slow)
                continue
        if decided is None and not _failed(rv):
            if not policy.postmortem and any(r in views and views[r].exit for r in roots):
                continue  # stopped by distdoctor: judged while it ran
            verdicts = {r: judge(r, rv, waited) for r in roots}
            hung = [r for r in roots if verdicts[r].state == "hang"]
            if not hung:
                if all(v.state == "long_wait" for v in verdicts.values()):
                    lw = long_wait_finding(rv, roots, waiters, waited, views, verdicts)
                    if lw is not None:
                        findings.append(lw)
                continue
            roots = hung
            why = {str(r): verdicts[r].why for r in hung}
        else:
            why = None
        by_rv[rv.key] = (rv, roots, why)
    # one finding per set of culprits, on the collective with the most ranks waiting
    by_culprits: dict[tuple, list] = {}
    for rv, roots, why in by_rv.values():
        by_culprits.setdefault(tuple(sorted(roots)), []).append((rv, roots, why))
    for roots, items in by_culprits.items():
        items.sort(key=lambda it: -len(it[0].arrivals))
        f = _hang_finding(list(roots), items, views)
        if items[0][2]:
            f.details["progress"] = items[0][2]
        findings.append(f)
    return findings


def _blocked(rv: Rendezvous, views: dict[int, RankView]) -> list[int]:
    """Ranks blocked in this rendezvous: in flight in it, and it is their newest op."""
    out = []
    for r, e in rv.arrivals.items():
        v = views.get(r)
        if (e.t_end_ns is None and v is not None and v.latest is not None
                and v.latest.index == e.index and (v.exit is None or v.stopped)):
            out.append(r)
    return sorted(out)


def _waiters(rv: Rendezvous) -> list[int]:
    return sorted(r for r, e in rv.arrivals.items() if e.t_end_ns is None)


def _hang_finding(roots: list[int], items, views) -> Finding:
    rv = items[0][0]
    waiters = _waiters(rv)
    failed = _failed(rv)
    waited = max((views[r].waited_s(rv.arrivals[r]) for r in waiters if r in views), default=0)
    first = next(iter(rv.arrivals.values()))
    who = ", ".join(map(str, roots))
    # on a multi-node job, a node's own `run` sees only its ranks: say so, not "dead"
    where = {r: where_is(views[r]) if r in views else "has no event log in this run dir "
             "(never started, or runs on another node: forward every node to one "
             "collector, `run --forward`, to see it)"
             for r in roots}
    if len(roots) == 1:
        detail = f"rank {roots[0]} {where[roots[0]]}"
    else:
        detail = "; ".join(f"rank {r} {w}" for r, w in where.items())
    if waiters or not failed:
        state = f"{len(waiters)} rank(s) waiting for {waited:.0f} s"
    else:
        state = (f"rank(s) {', '.join(map(str, failed))} failed in it "
                 f"({error_text(rv.arrivals[failed[0]].error, 80)})")
    summary = (f"hang: rank{'s' if len(roots) > 1 else ''} {who} never joined {first.op} "
               f"#{rv.seq} in group {rv.group}; {state}. {detail}")
    callsites = []
    for r in roots:
        v = views.get(r)
        if v is not None and v.exit_site:  # the line that ended it comes first
            callsites.append({"rank": r, **v.exit_site})
        ev = v.latest if v else None
        if ev is not None and ev.callsite:
            callsites.append(callsite_of(r, ev.callsite))
    seen = {(c["file"], c["line"]) for c in callsites}
    for r in waiters or failed:
        cs = callsite_of(r, rv.arrivals[r].callsite)
        if (cs["file"], cs["line"]) not in seen:
            seen.add((cs["file"], cs["line"]))
            callsites.append(cs)
    issued = {}
    for r in (*roots, *waiters, *failed):
        v = views.get(r)
        if v is not None:
            issued[str(r)] = v.issued.get(rv.group, 0)
    details = {"op": first.op, "group_desc": rv.group_desc, "waiting_ranks": waiters,
               "failed_ranks": failed,
               "waited_s": round(waited, 1), "where": {str(r): w for r, w in where.items()},
               "issued_in_group": issued,
               "also_stuck": [it[0].label() for it in items[1:]][:10]}
    gone = [r for r in roots if r in views and views[r].exit and not views[r].stopped]
    if gone:
        details["desync"] = (f"rank(s) {', '.join(map(str, gone))} finished with fewer "
                             f"collectives on this group than the others issued: a "
                             f"rank-dependent branch, one batch fewer or an exception "
                             f"swallowed on that rank made it skip some")
    return Finding("hang", "error", summary, roots, rv.group, rv.seq, callsites,
                   details=details, remedy=_HANG_REMEDY)


def _cycle_finding(comp: list[int], edges, views, familiar) -> Finding | None:
    parts, callsites = [], []
    for r in comp:
        rv, missing = edges[r]
        ev = rv.arrivals[r]
        waits = [m for m in missing if m in comp]
        parts.append(f"rank {r} waits in {ev.op} #{rv.seq} (group {rv.group}) for rank "
                     f"{', '.join(map(str, waits))}")
        callsites.append(callsite_of(r, ev.callsite))
    rvs = {edges[r][0].key: edges[r][0] for r in comp}
    # wrong group: one rank alone in its collective, everyone else of the cycle in one other
    lone = [r for r in comp if len(edges[r][0].arrivals) == 1 and not edges[r][0].is_p2p]
    others = {edges[r][0].key for r in comp if r not in lone}
    details = {"cycle": comp, "waits": parts,
               "rendezvous": [rv.label() for rv in rvs.values()]}
    for w in comp:  # one waits in a send/recv whose peer went on to a collective
        wrv = edges[w][0]
        peer = (wrv.key[3] if w == wrv.key[2] else wrv.key[2]) if wrv.is_p2p else None
        if peer in comp and not edges[peer][0].is_p2p:
            prv = edges[peer][0]
            if (w in prv.missing and len(prv.arrivals) > max(1, len(prv.missing))
                    and not same_batch(views.get(w), wrv.arrivals.get(w))):
                # a majority waits in it: w went past it to a send/recv with one of them
                return skipped_finding(w, wrv, prv, views, callsites, details)
            if still_arriving(prv, comp, views, views[w].waited_s(wrv.arrivals[w])):
                return None
            return unmatched_p2p_finding(peer, prv, wrv, callsites, details)
    if len(lone) == 1 and len(others) == 1 and len(comp) > 1:
        r = lone[0]
        rv, _ = edges[r]
        main = rvs[next(iter(others))]
        if familiar(rv.arrivals[r]) or not same_call(rv.arrivals[r], main):
            # its call is not the others' (another op, or another line and shape): it made
            # no call on a wrong group, it went past the one they wait in
            return skipped_finding(r, rv, main, views, callsites, details)
        summary = (f"rank {r} called {rv.arrivals[r].op} on group {rv.group} while ranks "
                   f"{', '.join(map(str, _waiters(main)))} wait for it in "
                   f"{main.label()}: rank {r} used the wrong process group")
        details["reason"] = "wrong_group"
        return Finding("mismatch", "error", summary, [r], rv.group, rv.seq, callsites,
                       details=details, remedy="Pass the same `group=` on every rank for "
                       "this collective (a sub-group created on some ranks only, or a "
                       "DeviceMesh axis mixed up).")
    wrong = wrong_peer_finding(comp, edges, callsites, details)
    if wrong is not None:
        return wrong
    summary = "deadlock: " + "; ".join(parts)
    first_rv = edges[comp[0]][0]
    return Finding("deadlock", "error", summary, comp, first_rv.group, first_rv.seq,
                   callsites, details=details,
                   remedy="The ranks issue the same ops in different orders: make every "
                   "rank issue p2p sends/recvs in a matching order (or use batch_isend_irecv) "
                   "and collectives of overlapping groups in the same order on all ranks.")


_HANG_REMEDY = ("Look at the culprit's stack: it is stuck in compute, I/O or a rank-dependent "
                "branch, or it skipped a collective the others issued (uneven batches, an "
                "exception swallowed on one rank). Fix the divergence; a longer timeout "
                "will not help.")
