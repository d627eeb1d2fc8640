"""Waits that are not plain hangs: a long wait (a busy rank keeps the others waiting), a
rank left alone in a collective after the others exited cleanly (one collective too
many), and a send dropped without wait() (its receiver waits for a message that never
comes). Used by hang.py for the rendezvous in flight and by the engine for the ones that
completed; pure functions over rendezvous and rank views.
"""

from __future__ import annotations

from collections import Counter

from distdoctor.diagnosis.hangs.progress import LONG_WAIT_MIN_S, STALL_S, Policy
from distdoctor.diagnosis.rendezvous import Rendezvous
from distdoctor.findings import Finding, callsite_of, site_phrase, who

MAX_SITES = 64  # distinct sampled lines counted per gap between a rank's ops


def long_wait_finding(rv: Rendezvous, roots: list[int], waiters: list[int], waited: float,
                      views: dict, verdicts: dict) -> Finding | None:
    """A wait in flight for ranks that are busy: a state (info), never an error."""
    if waited < LONG_WAIT_MIN_S:
        return None
    evidence = "; ".join(f"rank {r} {verdicts[r].why}" for r in roots if verdicts[r].why)
    summary = (f"long wait: {who(roots)} {'has' if len(roots) == 1 else 'have'} kept "
               f"{len(waiters)} rank(s) waiting {waited:.0f} s in {rv.label()}"
               + (f"; {evidence}" if evidence else ""))
    callsites = [callsite_of(w, rv.arrivals[w].callsite) for w in waiters[:1]]
    return Finding("long_wait", "info", summary, sorted(roots), rv.group, rv.seq, callsites,
                   details={"waiting_ranks": waiters, "waited_s": round(waited, 1),
                            "in_flight": True,
                            "progress": {str(r): verdicts[r].why for r in roots}},
                   remedy=_LONG_WAIT_REMEDY)


def completed_wait(rv: Rendezvous, where: dict[int, dict | None]) -> Finding | None:
    """A rendezvous that completed after a long wait: who kept whom waiting, how long and
    where (from each rank's own durations: no clocks are compared). `where`: the late
    rank's sampled position before it arrived."""
    durations = {r: (e.t_end_ns - e.t_enter_ns) / 1e9 for r, e in rv.arrivals.items()
                 if e.t_end_ns is not None}
    if len(durations) < 2:
        return None
    waited = max(durations.values())
    late_s = min(durations.values())
    if waited - late_s < LONG_WAIT_MIN_S:
        return None
    late = sorted(r for r, d in durations.items() if d - late_s < 1.0)
    waiters = sorted(r for r, d in durations.items() if d - late_s >= 1.0)
    summary = (f"long wait: {who(late)} kept {len(waiters)} rank(s) waiting "
               f"{waited - late_s:.0f} s in {rv.label()} (it completed)")
    callsites = []
    for r in late:
        pos = where.get(r)
        if pos:
            callsites.append({"rank": r, **pos, "source": "sample"})
            summary += (f"; rank {r} was in {pos.get('function')} "
                        f"({pos.get('file')}:{pos.get('line')})")
    callsites += [callsite_of(r, rv.arrivals[r].callsite) for r in late[:4]]
    if waiters:
        callsites.append(callsite_of(waiters[0], rv.arrivals[waiters[0]].callsite))
    return Finding("long_wait", "info", summary, late, rv.group, rv.seq, callsites,
                   details={"waiting_ranks": waiters, "waited_s": round(waited - late_s, 1),
                            "in_flight": False},
                   remedy=_LONG_WAIT_REMEDY)


_LONG_WAIT_REMEDY = ("Not an error: the ranks waited while these worked (a checkpoint, an "
                     "evaluation or data preparation on one rank). To shorten it, spread the "
                     "work over the ranks or make it asynchronous (torch.distributed.checkpoint "
                     "async_save).")


def extra_collective(rv: Rendezvous, roots: list[int], views: dict, waited: float,
                     confirm_s: float, familiar) -> Finding | None:
    """The ranks the others wait for have all exited cleanly: those left in the collective
    issued one the others never did (a collective inside `if is_global_zero:`), when
    they are the odd ones out: fewer than those that exited, or in a call never seen
    to complete on this group before. Else the exited ranks skipped one (None). On a
    group where no collective has completed yet (`familiar` None: the job's first), no
    call is familiar: more ranks in it than exited say the exited ones skipped it."""
    if not roots or not all(r in views and views[r].clean_exit and (
            views[r].latest is None or views[r].latest.status == "ok") for r in roots):
        return None  # (a rank whose last op failed left because of that failure)
    inside = sorted(rv.arrivals)
    known = familiar(rv.arrivals[inside[0]])
    if (len(inside) > len(roots)) if known is None else (len(inside) >= len(roots) and known):
        return None  # the usual call, most ranks in it: the ones that left skipped it
    failed = [r for r, e in rv.arrivals.items() if e.status in ("error", "timeout")]
    if not failed and waited < confirm_s:
        return None
    first = rv.arrivals[inside[0]]
    where = site_phrase(first.callsite, full=True)
    summary = (f"hang: {who(inside)} {'is' if len(inside) == 1 else 'are'} left alone in "
               f"{rv.label()}{where} after {who(roots)} exited normally: "
               f"{who(inside)} issued one collective too many (a collective inside a "
               f"rank-dependent branch, e.g. `if trainer.is_global_zero:` or "
               f"`if accelerator.is_main_process:`)")
    issued = {str(r): views[r].issued.get(rv.group, 0) for r in (*inside, *roots)
              if r in views}
    return Finding("hang", "error", summary, inside, rv.group, rv.seq,
                   [callsite_of(r, rv.arrivals[r].callsite) for r in inside],
                   details={"reason": "extra_collective", "exited_ranks": sorted(roots),
                            "failed_ranks": sorted(failed), "issued_in_group": issued,
                            "waited_s": round(waited, 1)},
                   remedy="Every rank must issue the same collectives: move the collective "
                   "out of the branch that runs on some ranks only (call all_gather / "
                   "gather_object on every rank, then use the result on rank 0).")


def dropped_sends(open_rv, views: dict, policy: Policy) -> tuple[list[Finding], set[int]]:
    """Sends in flight whose sender has moved on and is blocked elsewhere (an isend whose
    work was never waited on) while the receiver waits in the matching recv. Returns the
    findings and the ranks they explain."""
    out: list[Finding] = []
    explained: set[int] = set()
    bound = policy.fixed_s if policy.fixed_s is not None else STALL_S
    for rv in open_rv:
        if not rv.is_p2p or rv.missing:
            continue
        src, dst = rv.key[2], rv.key[3]
        send, recv = rv.arrivals.get(src), rv.arrivals.get(dst)
        sv, dv = views.get(src), views.get(dst)
        if (send is None or recv is None or sv is None or dv is None or sv.latest is None
                or dv.latest is None or send.t_end_ns is not None
                or recv.t_end_ns is not None or send.op != "send"):
            continue
        if sv.latest.index == send.index or dv.latest.index != recv.index:
            continue  # the sender waits in it (a slow transport), or nobody waits for it
        if sv.exit is None and sv.latest.t_end_ns is not None:
            continue  # the sender computes: its wait() may still come
        waited = dv.waited_s(recv)
        if waited < bound:
            continue
        cs = send.callsite or {}
        summary = (f"hang: rank {src}'s isend #{rv.seq} to rank {dst} in group {rv.group}"
                   f"{' at ' + str(cs.get('file')) + ':' + str(cs.get('line')) if cs else ''}"
                   f" never completed and its request was never waited on (dropped): rank "
                   f"{dst} has waited {waited:.0f} s in the matching recv")
        if sv.latest.t_end_ns is None:
            summary += f"; rank {src} went on and waits in {sv.latest.op} #{sv.latest.seq}"
        out.append(Finding(
            "hang", "error", summary, [src], rv.group, rv.seq,
            [callsite_of(src, send.callsite), callsite_of(dst, recv.callsite)],
            details={"reason": "dropped_send", "receiver": dst, "waited_s": round(waited, 1),
                     "waiting_ranks": [dst]},
            remedy="Keep the request every isend/irecv returns and call wait() on it (or on "
                   "every work of batch_isend_irecv) before the tensor is reused or the "
                   "request goes out of scope: a dropped request can lose the message."))
        explained.update((src, dst))
    return out, explained


def skipped_finding(r: int, rv: Rendezvous, main: Rendezvous, views, callsites,
                     details) -> Finding:
    """The lone rank's call is an ordinary one for its group: it did not pick the wrong
    group, it skipped the collective the others wait in and went on to its next op."""
    ev = rv.arrivals[r]
    waiters = sorted(r for r, e in main.arrivals.items() if e.t_end_ns is None)
    issued = views[r].issued.get(main.group, 0) if r in views else None
    others = sorted({views[w].issued.get(main.group, 0) for w in waiters if w in views})
    summary = (f"hang: rank {r} skipped {main.label()} that ranks "
               f"{', '.join(map(str, waiters))} wait in, and went on to {ev.op} #{rv.seq} "
               f"in group {rv.group}")
    if issued is not None and others:
        summary += (f" (it has issued {issued} collective(s) on group {main.group}, the "
                    f"others {others[-1]})")
    details.update(reason="skipped_collective", waiting_ranks=waiters,
                   issued_in_group={str(r): issued})
    main_first = main.arrivals[waiters[0]] if waiters else None
    if main_first is not None and main_first.callsite:
        callsites.append(callsite_of(waiters[0], main_first.callsite))
    return Finding("hang", "error", summary, [r], main.group, main.seq, callsites,
                   details=details, remedy="A rank-dependent branch or one batch fewer made "
                   "this rank skip a collective: every rank must issue the same collectives "
                   "on a group, in the same order.")


def same_batch(view, ev) -> bool:
    """Whether the rank's pending send/recv came in one batch with the op before it
    (batch_isend_irecv: consecutive ops, the same peer, within a few ms, the second
    posted before the first completed): the two sides' lists disagree, rather than the
    rank having gone past a collective. A blocking recv that found its message waiting
    and the next one posted a moment later (r23 on a loaded machine) are no batch."""
    done = view.last_done if view is not None else None
    return (ev is not None and done is not None and done.kind == "p2p"
            and done.index == ev.index - 1 and done.peer_global == ev.peer_global
            and abs(ev.t_enter_ns - done.t_enter_ns) < _BATCH_NS
            and (done.t_end_ns is None or ev.t_enter_ns <= done.t_end_ns))


_BATCH_NS = 5_000_000  # the ops of one batch_isend_irecv are posted within a few ms


# how long a wait cycle's blame waits for the other ranks of the collective a peer went on
# to (under load they may be seconds behind): their arrival is what tells who went past it
ARRIVING_S = 30.0


def still_arriving(rv: Rendezvous, comp: list[int], views: dict, waited_s: float) -> bool:
    """Ranks missing from the collective `rv`, outside the wait cycle `comp`, alive, not
    stopped and in no wait (issued nothing yet, or their last op completed): on their way
    to it. While they are, and the cycle is younger than ARRIVING_S, its blame waits."""
    if waited_s >= ARRIVING_S:
        return False
    for m in rv.missing:
        v = views.get(m)
        if m not in comp and v is not None and not v.exit and not v.stopped and (
                v.latest is None or v.latest.t_end_ns is not None):
            return True
    return False


def all_joined_finding(rv: Rendezvous, views, explained: bool) -> Finding:
    waiters = sorted(r for r, e in rv.arrivals.items() if e.t_end_ns is None)
    waited = max((views[r].waited_s(rv.arrivals[r]) for r in waiters if r in views), default=0)
    if explained:
        summary = (f"hang: ranks {', '.join(map(str, waiters))} are stuck in {rv.label()} "
                   f"for {waited:.0f} s because of the mismatch reported there")
        return Finding("hang", "warning", summary, [], rv.group, rv.seq, [],
                       details={"waiting_ranks": waiters, "waited_s": round(waited, 1),
                                "explained_by": "mismatch"})
    summary = (f"hang: every rank joined {rv.label()} but it has not completed after "
               f"{waited:.0f} s; the transport is stuck or the ranks disagree in a way the "
               f"tracer cannot see")
    return Finding("hang", "error", summary, [], rv.group, rv.seq,
                   [callsite_of(r, rv.arrivals[r].callsite) for r in waiters[:1]],
                   details={"waiting_ranks": waiters, "waited_s": round(waited, 1),
                            "group_desc": rv.group_desc},
                   remedy="Check the network/transport (NCCL_DEBUG=INFO) and the ranks' "
                   "stacks; a collective on tensors of different sizes can also block.")


def unmatched_p2p_finding(r: int, rv: Rendezvous, main: Rendezvous, callsites,
                          details) -> Finding:
    """The others wait in a send or receive with rank r, and r went on to a collective
    without posting the matching op: an unmatched send/recv (batch_isend_irecv lists that
    disagree, a wrong peer), said with both sides' lines."""
    ev = rv.arrivals[r]
    src, dst = main.key[2], main.key[3]
    waiter = dst if r == src else src
    wev = main.arrivals.get(waiter)
    here = _at(wev)
    if waiter == dst:
        wait, posted = f"to receive from rank {r}", "posted no matching send"
    else:
        wait, posted = f"to send to rank {r}", "posted no matching receive"
    summary = (f"hang: rank {waiter} waits {wait} ({wev.op if wev else 'p2p'} #{main.seq} in "
               f"group {main.group}{here}); rank {r} {posted} and went on to {ev.op} "
               f"#{rv.seq} in group {rv.group}{_at(ev)}")
    details.update(reason="unmatched_p2p", waiting_ranks=[waiter],
                   unmatched={"rank": waiter, "op": wev.op if wev else None,
                              "peer": r, "seq": main.seq})
    if wev is not None and wev.callsite:
        callsites.insert(0, callsite_of(waiter, wev.callsite))
    return Finding("hang", "error", summary, [r], main.group, main.seq, callsites,
                   details=details, remedy="Every send needs a receive on its peer with the "
                   "same size, and every receive a send: the ranks' lists for "
                   "batch_isend_irecv (or their send/recv calls) must mirror each other, peer "
                   "for peer and count for count.")


def wrong_peer_finding(comp: list[int], edges: dict, callsites, details) -> Finding | None:
    """In a cycle of ranks blocked in sends and receives: a rank that sends to a peer
    waiting on someone else, while another rank waits to receive from it (or receives
    from a peer that sends elsewhere while another sends to it), used the wrong peer."""
    sends, recvs = {}, {}  # rank -> (its peer, its event)
    for r in comp:
        rv, _ = edges[r]
        if not rv.is_p2p:
            continue
        src, dst = rv.key[2], rv.key[3]
        if r == src:
            sends[r] = (dst, rv.arrivals.get(r))
        elif r == dst:
            recvs[r] = (src, rv.arrivals.get(r))
    for r, (peer, ev) in sends.items():
        expecting = [x for x, (frm, _) in recvs.items() if frm == r and x != peer]
        if peer in recvs and recvs[peer][0] != r and expecting:
            x = expecting[0]
            summary = (f"rank {r} sends to rank {peer}{_at(ev)}, but rank {peer} waits to "
                       f"receive from rank {recvs[peer][0]}{_at(recvs[peer][1])}, and rank "
                       f"{x} waits to receive from rank {r}{_at(recvs[x][1])}: rank {r} sent "
                       f"to the wrong peer (rank {x} expects its message)")
            return _peer_finding(r, ev, summary, callsites, details)
    for r, (peer, ev) in recvs.items():
        sending = [x for x, (to, _) in sends.items() if to == r and x != peer]
        if peer in sends and sends[peer][0] != r and sending:
            x = sending[0]
            summary = (f"rank {r} waits to receive from rank {peer}{_at(ev)}, but rank {peer} "
                       f"sends to rank {sends[peer][0]}{_at(sends[peer][1])}, and rank {x} "
                       f"sends to rank {r}{_at(sends[x][1])}: rank {r} receives from the "
                       f"wrong peer (rank {x} is sending to it)")
            return _peer_finding(r, ev, summary, callsites, details)
    return None


def _peer_finding(r: int, ev, summary: str, callsites, details) -> Finding:
    details["reason"] = "wrong_peer"
    first = [c for c in callsites if c.get("rank") == r]
    rest = [c for c in callsites if c.get("rank") != r]
    rv_group = ev.group if ev is not None else None
    return Finding("deadlock", "error", "deadlock: " + summary, [r], rv_group,
                   ev.seq if ev is not None else None, first + rest, details=details,
                   remedy="Check the peer each rank passes to send/recv (or P2POp): the "
                   "stage layout (e.g. rank + 1 vs a mesh's next stage) must be computed the "
                   "same way on every rank.")


def _at(ev) -> str:
    return site_phrase(ev.callsite) if ev is not None else ""


class Gaps:
    """Where each rank's main thread was between its ops: the tracer's sampled lines
    since its previous op, counted; kept for its last few ops (bounded)."""

    KEEP = 16

    def __init__(self):
        self.open: dict[int, Counter] = {}  # rank -> lines since its newest op
        self.last: dict[int, tuple] = {}  # rank -> newest sampled (file, line, function)
        self.moved_ns: dict[int, int] = {}  # rank -> its clock when that line changed
        self.seen_ns: dict[int, int] = {}  # rank -> its clock at its newest sample
        self.before: dict[int, dict[int, Counter]] = {}  # rank -> op index -> lines

    def sample(self, rank: int, callsite: dict | None, t_ns: int) -> None:
        if not callsite:
            return
        site = (callsite.get("file"), callsite.get("line"), callsite.get("function"))
        c = self.open.get(rank)
        if c is None:
            c = self.open[rank] = Counter()
        if site in c or len(c) < MAX_SITES:
            c[site] += 1
        if self.last.get(rank) != site:
            self.last[rank] = site
            self.moved_ns[rank] = t_ns
        self.seen_ns[rank] = t_ns

    def op(self, rank: int, index: int) -> None:
        """The rank issued op `index`: the lines counted so far were before it."""
        c = self.open.pop(rank, None)
        if c:
            held = self.before.setdefault(rank, {})
            held[index] = c
            if len(held) > self.KEEP:
                del held[min(held)]

    def where_before(self, rank: int, index: int) -> dict | None:
        return _top(self.before.get(rank, {}).get(index))

    def where_now(self, rank: int) -> dict | None:
        return _top(self.open.get(rank))


def _top(c: Counter | None) -> dict | None:
    if not c:
        return None
    (file, line, function), _ = c.most_common(1)[0]
    return {"file": file, "line": line, "function": function}


def same_call(ev, main: Rendezvous) -> bool:
    """Whether the lone rank's op is the call the others wait in, made with another
    group: the same op, from the same line or with the same tensors."""
    theirs = next(iter(main.arrivals.values()), None)
    if theirs is None or theirs.op != ev.op:
        return False
    mine, other = ev.callsite or {}, theirs.callsite or {}
    return ((mine.get("file"), mine.get("line")) == (other.get("file"), other.get("line"))
            or (ev.shapes, ev.dtypes) == (theirs.shapes, theirs.dtypes))
