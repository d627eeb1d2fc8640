"""A lost node: one that fell silent while the ranks on the other nodes wait for its ranks.

A node whose link (or host) goes down sends nothing more: no reset reaches the collector,
its stream just stops. Silence alone is not loss: a busy node, or a congested management
network, delays its reports while its job goes on (reports.py: a `host` state, never a
hang). But a node silent for LOST_S (five digests of a job past 50,000 ranks, ten of a smaller one), while ranks on nodes that still report are blocked in an op with its ranks (a collective of a group
it has members in, a p2p op with one of its ranks) past the hang rule, is the job's hang,
and the lost node its culprit: one `hang` finding naming the node and its ranks. The
other nodes' own `run`s see only that ranks of another node never joined.

Works on positions from the copy of the nodes' logs (`copy_positions`) or from their
digests (fleet.py); the collector (server.py) checks only while some node is silent.
"""

from __future__ import annotations

from dataclasses import dataclass

from distdoctor.findings import Finding, callsite_of
from distdoctor.runlog.reader import Event

LOST_S = 5.0  # silent this long while others wait for it: lost
TAIL = 64  # events read back from a log's newest for its newest op
# What one finding lists of the others (the waiting nodes and ranks, the lost ranks'
# last ops); the counts say the rest. Every waiting node in each finding, a network split
# of a 300-node job (150 lost, each waited for by the other 150) made the collector's
# findings 1.2 MB, past what findings.json holds for one source: none of them was written.
SAY_HOSTS = 4  # in the summary
MAX_LISTED = 64  # in details: waiting_hosts, last_heard (4x as many waiting_ranks)

REMEDY = ("The node stopped answering while the others wait for its ranks: check its "
          "network link (`ip link` on the node, its switch port, the cable or the NIC's "
          "errors) and whether the host itself is up (console, BMC). The job cannot go on "
          "without it: stop it, and restart it without the node (or with a replacement: "
          "torchrun --nnodes MIN:MAX re-forms the job from the nodes that answer).")


@dataclass
class Position:
    """A rank's newest op as the collector knows it, and how long it has been in it."""

    rank: int
    host: str
    op: Event | None  # its newest collective or p2p op
    waited_s: float  # in `op`, when it is still in flight (else 0)


def members(ev: Event) -> set[int]:
    """The ranks an op waits on: its group's, or its p2p peer."""
    if ev.kind == "p2p":
        peer = ev.peer_global
        return set() if peer is None else {peer}
    return set(ev.group_ranks)


def lost_node_findings(silent: dict[str, tuple[float, bool]],
                       positions: dict[int, Position], wait_s: float) -> list[Finding]:
    """Hang findings for the nodes in `silent` (host -> (seconds since it last sent
    anything, whether its stream ended)) whose ranks others, on nodes not silent, have
    waited for `wait_s` or more.

    One pass over the positions, whatever the number of silent nodes: when a congested
    management network makes hundreds of nodes late at once, a pass per silent node over
    100,000 ranks was 10^8 steps a check. The silent nodes an op waits on are found once
    per group (ranks blocked in one group share its member list)."""
    theirs: dict[str, set[int]] = {}  # silent host -> its ranks
    for r, p in positions.items():
        if p.host in silent:
            theirs.setdefault(p.host, set()).add(r)
    if not theirs:
        return []
    silent_host = {r: h for h, ranks in theirs.items() for r in ranks}
    waited_on: dict[tuple, set[str]] = {}  # (kind, group, its member list or peer) -> hosts
    blocked: dict[str, list[Position]] = {}
    for p in positions.values():
        ev = p.op
        if p.host in silent or ev is None or ev.t_end_ns is not None or p.waited_s < wait_s:
            continue
        key = ((ev.kind, ev.peer_global) if ev.kind == "p2p"
               else (ev.kind, ev.group, id(ev.group_ranks)))
        hosts = waited_on.get(key)
        if hosts is None:
            hosts = waited_on[key] = {silent_host[m] for m in members(ev) if m in silent_host}
        for host in hosts:
            blocked.setdefault(host, []).append(p)
    return [_finding(host, *silent[host], theirs[host], blocked[host], positions)
            for host in sorted(blocked)]


def _where(p: Position | None) -> str:
    if p is None or p.op is None:
        return "no op heard of"
    ev = p.op
    state = "in flight" if ev.t_end_ns is None else "completed"
    return f"{ev.op} #{ev.seq} in group {ev.group} ({state})"


def _finding(host: str, silent_s: float, closed: bool, theirs: set[int],
             blocked: list[Position], positions: dict[int, Position]) -> Finding:
    from distdoctor.diagnosis.report import rank_ranges

    # the op most ranks wait in names the hang; the lost ranks are those it waits on
    by_op: dict[tuple, list[Position]] = {}
    for p in blocked:
        by_op.setdefault((p.op.group, p.op.seq, p.op.kind), []).append(p)
    main = max(by_op.values(), key=len)
    ev = main[0].op
    culprits = sorted(set().union(*(members(p.op) for p in blocked)) & theirs)
    waiters = sorted(p.rank for p in blocked)
    waited = max(p.waited_s for p in blocked)
    hosts = sorted({p.host for p in blocked})
    # a stream that stalled (no reset: a link down, a host gone) or one that ended
    # without the job's end (its `distdoctor run` killed, or its host rebooted)
    heard = ("its stream to the collector ended without the job's end" if closed
             else "nothing heard from it")
    on = ", ".join(hosts[:SAY_HOSTS]) + (f" and {len(hosts) - SAY_HOSTS} more nodes"
                                          if len(hosts) > SAY_HOSTS else "")
    summary = (f"hang: node {host} (rank{'s' if len(culprits) > 1 else ''} "
               f"{rank_ranges(culprits)}) is lost: {heard} for {silent_s:.0f} s, while "
               f"rank{'s' if len(waiters) > 1 else ''} {rank_ranges(waiters)} on "
               f"{on} wait{'' if len(waiters) > 1 else 's'} for it in {ev.op} "
               f"#{ev.seq} in group {ev.group} "
               f"({waited:.0f} s): its network link or the node itself is down")
    callsites = [callsite_of(p.rank, p.op.callsite) for p in main[:1]]
    seen = {(c["file"], c["line"]) for c in callsites}
    for r in culprits:
        p = positions.get(r)
        if p is not None and p.op is not None and p.op.callsite:
            c = callsite_of(r, p.op.callsite)
            if (c["file"], c["line"]) not in seen:
                seen.add((c["file"], c["line"]))
                callsites.append(c)
    details = {"reason": "lost_node", "host": host, "hosts": [host], "silent_s":
               round(silent_s, 1), "stream_ended": closed,
               "waiting_ranks": waiters[:4 * MAX_LISTED], "waiting_count": len(waiters),
               "waiting_hosts": hosts[:MAX_LISTED], "waiting_hosts_count": len(hosts),
               "waited_s": round(waited, 1), "op": ev.op, "group_desc": ev.group_desc,
               "last_heard": {str(r): _where(positions.get(r))
                              for r in sorted(theirs)[:MAX_LISTED]}}
    return Finding("hang", "error", summary, culprits, ev.group, ev.seq, callsites,
                   details=details, remedy=REMEDY)


def copy_positions(run_dir, logs: dict[int, tuple[int, str]]) -> dict[int, Position]:
    """Positions from the collector's copy of full logs: `logs` rank -> (its newest log
    number, the node that sends it). A wait runs to the rank's newest heartbeat (its
    clock, a second apart at most), never compared with another clock."""
    from distdoctor.errors import UserError
    from distdoctor.runlog import format as F
    from distdoctor.runlog.reader import RankLog
    from distdoctor.runlog.rundir import ring_path

    out = {}
    for rank, (number, host) in logs.items():
        try:
            log = RankLog(ring_path(run_dir, rank, number))
        except (UserError, OSError):
            continue
        try:
            head = log.word(F.OFF_HEAD)
            hb = log.word(F.OFF_HEARTBEAT_MONO, F.I64)
            newest = None
            for ev in reversed(log.read_range(max(0, head - TAIL), head)):
                if ev is not None and ev.kind in ("collective", "p2p"):
                    newest = ev
                    break
        except Exception:  # a node's corrupt copy costs that rank's position, never the
            continue  # diagnosis of the node gone quiet (the reader says the rest)
        finally:
            log.close()
        waited = 0.0
        if newest is not None and newest.t_end_ns is None and hb:
            waited = max(0.0, (hb - newest.t_enter_ns) / 1e9)
        out[rank] = Position(rank, host, newest, waited)
    return out


def digest_positions(fleet, now_s: float) -> dict[int, Position]:
    """Positions from the nodes' digests (fleet.FleetEngine): every rank's newest op and
    how long it has waited in it, a silent node's as last reported, the others' now."""
    out = {}
    with fleet.lock:
        for r, p in fleet.positions.items():
            latest = p.ops()[0]
            now_ns = fleet._now_ns(p, now_s)
            waited = 0.0
            if latest is not None and latest.t_end_ns is None and now_ns is not None:
                waited = max(0.0, (now_ns - latest.t_enter_ns) / 1e9)
            out[r] = Position(r, p.host, latest, waited)
    return out
