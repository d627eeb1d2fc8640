"""Slow links between nodes, from the time cross-node collectives take once every member
is in them.

A slow link keeps no rank late: every member of a collective over it enters on time and
then waits inside it, all together, for the data to cross (a ring all-reduce goes at its
slowest hop's pace). The straggler measure (who waited least) sees nothing; what changes
is the collective's own time: the shortest wait among its members, which is the time it
took once the last member arrived (each wait measured on its rank's own clock: no clock
is compared with another's). For one kind of collective (group, op, element count) that
time is steady while the network is; a link that slows makes it many times longer, step
after step, whatever the ranks compute.

So, per kind of collective over ranks on two or more nodes: the best time it has shown
(the median of BLOCK consecutive ones, the lowest seen: the link's proven speed), against
the median of its newest BLOCK. RATIO times the best or more, by at least
MIN_LATENESS_MS, and every one of the newest at least FLOOR times the best (a burst of
congestion, a rank descheduled now and then, a busy CPU, is not a link): one straggler finding per set of nodes, cause
"link", naming them; `ranks` is empty (no rank's program is at fault) and the ranks it
slows are in `details.slowed_ranks`. Fed by the collector from the nodes' logs (the copy,
mirror.py) or from their digests (fleet.py); memory: BLOCK * 2 times per kind, at most
MAX_KINDS kinds.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from distdoctor.diagnosis.stragglers.straggler import MIN_LATENESS_MS
from distdoctor.findings import Finding

BLOCK = 8  # collectives per median
# The newest block this many times the best one: a slow link. Gloo on a busy 2-core
# machine (CPU hogs beside a healthy job) showed blocks up to 3.6x its best (1,065
# all-reduces); a link at 50 Mbit/s instead of a veth's speed, 85-175x.
RATIO = 8.0
FLOOR = RATIO / 2  # ... with every time of the block at least this many times the best
MAX_KINDS = 4096

REMEDY = ("The network between these nodes delivers less than it did, for every rank "
          "alike: check both ends' NICs and switch ports (link speed and errors: `ethtool "
          "eth0`, `ethtool -S`, `ip -s link`), a rate limit or traffic shaping on the path, "
          "and other jobs' traffic on it; `distdoctor nccl-test --pairwise` between the two "
          "nodes measures the link. No rank's code is at fault.")


@dataclass
class _Kind:
    """One kind of collective: its members and its recent own times (ms)."""

    members: tuple[int, ...]
    recent: deque = field(default_factory=lambda: deque(maxlen=BLOCK))
    best_ms: float | None = None  # the lowest median of BLOCK consecutive times
    callsite: dict | None = None
    count: int = 0
    slow_since: float | None = None  # wall clock, when its newest block turned slow

    def add(self, own_ms: float) -> None:
        self.recent.append(own_ms)
        self.count += 1
        if len(self.recent) == BLOCK:
            median = statistics.median(self.recent)
            if self.best_ms is None or median < self.best_ms:
                self.best_ms = median

    def slow(self) -> tuple[float, float] | None:
        """(its time now, the best) when the newest block says the link slowed."""
        best = self.best_ms
        if not best or self.count < 2 * BLOCK or len(self.recent) < BLOCK:
            return None  # (a best of 0 ms, waits a node said were 0 ns: no ratio to it)
        now = statistics.median(self.recent)
        if now < RATIO * best or now - best < MIN_LATENESS_MS:
            return None
        if min(self.recent) < FLOOR * best:
            return None
        return now, best


class LinkWatch:
    def __init__(self):
        self.kinds: dict[tuple, _Kind] = {}
        self.found: dict[tuple, Finding] = {}  # hosts -> the finding (kept once made)
        self.version = 0  # rises when findings() would say something new
        self._lock = threading.Lock()  # fed by the nodes' threads, read by another

    def add(self, group: str, op: str, numel: int, members, own_ms: float,
            callsite: dict | None = None) -> None:
        """One collective every member of which finished: `own_ms` the shortest wait
        among them. The caller only passes collectives of groups that span nodes."""
        key = (group, op, numel)
        with self._lock:
            kind = self.kinds.get(key)
            if kind is None:
                if len(self.kinds) >= MAX_KINDS:
                    del self.kinds[next(iter(self.kinds))]
                kind = self.kinds[key] = _Kind(tuple(members))
            if callsite and kind.callsite is None:
                kind.callsite = callsite
            kind.add(own_ms)

    def findings(self, host_of: dict[int, str]) -> list[Finding]:
        """One finding per set of nodes whose links slowed; a finding stays once made (the
        job had it), with its newest numbers while the link stays slow."""
        with self._lock:
            return self._findings(host_of)

    def _findings(self, host_of: dict[int, str]) -> list[Finding]:
        slow: dict[tuple, list] = {}
        for key, kind in self.kinds.items():
            got = kind.slow()
            if got is None:
                kind.slow_since = None
                continue
            hosts = tuple(sorted({host_of.get(r, "") for r in kind.members}))
            if len(hosts) < 2 or "" in hosts:
                continue  # one node's own collective (not a link between nodes), or a
                # member whose node has not said yet
            if kind.slow_since is None:
                kind.slow_since = time.time()
            slow.setdefault(hosts, []).append((got[0] - got[1], key, kind, got))
        for hosts in _narrowest(slow):
            worst = max(slow[hosts], key=lambda item: item[0])
            f = _finding(hosts, worst[1], worst[2], *worst[3], host_of,
                         [item[1] for item in slow[hosts]])
            if hosts not in self.found:
                self.version += 1
            self.found[hosts] = f
        return list(self.found.values())


def _narrowest(slow: dict[tuple, list]) -> list[tuple]:
    """Sets of nodes with slow collectives, less those that hold another such set: a
    group over nodes a, b and c that is slow because the a-b link is adds nothing to
    what the a-b group says."""
    sets = sorted(slow, key=len)
    return [s for i, s in enumerate(sets) if not any(set(t) < set(s) for t in sets[:i])]


def _finding(hosts: tuple, key: tuple, kind: _Kind, now_ms: float, best_ms: float,
             host_of: dict, keys: list) -> Finding:
    from distdoctor.diagnosis.report import rank_ranges

    group, op, numel = key
    slowed = sorted(kind.members)
    link = (f"the link between node {hosts[0]} and node {hosts[1]}" if len(hosts) == 2
            else "the links between nodes " + ", ".join(hosts))
    by_host = {h: sorted(r for r in slowed if host_of.get(r) == h) for h in hosts}
    since = time.strftime("%H:%M:%S", time.localtime(kind.slow_since or time.time()))
    summary = (f"straggler: {link} is slow: {op} of {numel:,} elements in group {group} "
               f"takes {now_ms:.0f} ms once every rank is in it, {now_ms / best_ms:.0f}x "
               f"the {best_ms:.1f} ms it took before (since {since}): the link, not a "
               f"rank, is slow (ranks "
               + "; ".join(f"{rank_ranges(rs)} on {h}" for h, rs in by_host.items()) + ")")
    callsites = []
    if kind.callsite:
        for h in hosts:  # the line each node's ranks wait at
            if by_host[h]:
                callsites.append({"rank": by_host[h][0], "file": kind.callsite.get("file"),
                                  "line": kind.callsite.get("line"),
                                  "function": kind.callsite.get("function")})
    details = {"cause": "link", "hosts": list(hosts), "slowed_ranks": slowed,
               "ranks_by_host": by_host, "op": op, "numel": numel,
               "collective_ms": round(now_ms, 2), "before_ms": round(best_ms, 2),
               "ratio": round(now_ms / best_ms, 1), "since": since,
               "slow_collectives": [{"group": g, "op": o, "numel": n} for g, o, n in keys],
               "source": "collector"}
    return Finding("straggler", "warning", summary, [], group, None, callsites,
                   details=details, remedy=REMEDY)


MAX_PENDING = 100_000  # collectives awaiting some member's completion


class CopyWaits:
    """The collector's copy of full logs (mirror.py): each member's completion of a
    collective as its node sends it, merged per (group, seq) until every member's is in;
    then the collective's own time (the shortest wait) goes to the LinkWatch. Any thread
    (one per node)."""

    def __init__(self, watch: LinkWatch):
        self.watch = watch
        self._lock = threading.Lock()
        # (group, seq) -> [ranks in, shortest wait ns, hosts seen]
        self._pending: dict[tuple, list] = {}

    def completed(self, ev, host: str) -> None:
        """A member's completed collective (an Event of the copy), sent by node `host`."""
        members = ev.group_ranks
        if len(members) < 2 or ev.status != "ok" or ev.t_end_ns is None:
            return
        wait = ev.t_end_ns - ev.t_enter_ns
        key = (ev.group, ev.seq)
        with self._lock:
            entry = self._pending.get(key)
            if entry is None:
                if len(self._pending) >= MAX_PENDING:
                    del self._pending[next(iter(self._pending))]
                entry = self._pending[key] = [set(), wait, set()]
            ranks = entry[0]
            if ev.rank in ranks:
                return  # sent again (a reconnection resends the newest events)
            ranks.add(ev.rank)
            entry[1] = min(entry[1], wait)
            entry[2].add(host)
            if len(ranks) < len(members):
                return
            del self._pending[key]
        if len(entry[2]) >= 2:  # over nodes: a link between them
            self.watch.add(ev.group, ev.op, ev.numel_in, members, entry[1] / 1e6,
                           ev.callsite)
