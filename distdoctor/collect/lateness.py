"""Stragglers across nodes, from the waits the nodes' digests carry (collect/digest.py).

For each collective of a group that spans nodes, every node with members in it reports,
once its members all finished it, how many did, the shortest wait among them, whose it
was, and the next shortest. Waits are clock-independent (each measured on its rank's own
clock; everyone leaves a collective at about the same moment), so once every member is
accounted for:

- the rank with the shortest wait over all nodes arrived last, and kept the others
  waiting for the gap to the next shortest wait: straggler.py's measure, taken against
  the next-to-last;
- the node whose shortest wait is shortest arrived last as a whole, by the gap to the
  next node's shortest wait: a slow node (its host, its network, the data it reads) is
  late as a cohort, which the rank measure cannot see when the group has several of the
  node's ranks.

Lateness is summed per rank and per node in 1 s buckets. The verdict, over the newest
WINDOW_S buckets: the lateness per step (the steps the rank's node says it finished in
that time, else per second) averages at least MIN_LATENESS_MS and stands MIN_T standard
errors above zero. Ranks found late on one node with others of its ranks are one finding
about the node. Memory: one entry per collective still awaiting a node's report (capped),
and WINDOW_S buckets per rank and node.
"""

from __future__ import annotations

import math
from collections import deque

from distdoctor.collect import bounded
from distdoctor.diagnosis.stragglers.straggler import MIN_LATENESS_MS
from distdoctor.findings import Finding

WINDOW_S = 10  # buckets of 1 s the verdict looks at
MIN_BUCKETS = 5
MIN_T = 4.0
MAX_PENDING = 100_000


class _Pending:
    __slots__ = ("count", "lows", "what")

    def __init__(self):
        self.count = 0
        self.lows: list[tuple] = []  # (shortest wait, its rank, next shortest, host)
        self.what: tuple | None = None  # (op, elements), from nodes that say


class _Series:
    """Lateness in ms per 1 s bucket, the newest WINDOW_S + 1 buckets."""

    __slots__ = ("buckets", "last")

    def __init__(self):
        self.buckets: deque = deque(maxlen=WINDOW_S + 1)  # [second, ms, times last]
        self.last = 0

    def add(self, second: int, ms: float) -> None:
        b = self.buckets
        if not b or b[-1][0] != second:
            b.append([second, 0.0, 0])
        b[-1][1] += ms
        b[-1][2] += 1

    def window(self, now_second: int) -> tuple[list[float], int, int]:
        """The finished buckets of the window: (ms of each, a quiet second counting as
        zero; how many buckets it was last in; how many times it was last)."""
        xs, buckets, times = [], 0, 0
        for second, ms, last in self.buckets:
            if now_second - WINDOW_S <= second < now_second:
                xs.append(ms)
                buckets += 1
                times += last
        return xs + [0.0] * (WINDOW_S - len(xs)), buckets, times


class FleetLateness:
    def __init__(self, min_lateness_ms: float = MIN_LATENESS_MS, links=None):
        """`links`: a LinkWatch (links.py) given each merged collective's own time."""
        self.min_lateness_ms = min_lateness_ms
        self.links = links
        self.pending: dict[tuple, _Pending] = {}
        self.ranks: dict[int, _Series] = {}
        self.nodes: dict[str, _Series] = {}
        self.merged = 0  # collectives whose every member was accounted for

    def add(self, host: str, waits: list, sizes: dict, now_s: float,
            groups: dict | None = None, callsites: dict | None = None) -> None:
        """One node's waits (digest: [group, seq, finished, shortest ns, rank, next ns,
        (op, elements)]), already checked; `sizes`: group -> members; for the links'
        watch, `groups`: group -> (description, members), `callsites`: group -> the line
        of one of its collectives."""
        for group, seq, n, low, rank, second, what in waits:
            size = sizes.get(group)
            if not size:
                continue
            key = (group, seq)
            entry = bounded.entry(self.pending, key, MAX_PENDING, _Pending)
            entry.count += n
            entry.lows.append((low, rank, second, host))
            entry.what = entry.what or what
            if entry.count >= size:
                del self.pending[key]
                self._merge(entry.lows, int(now_s))
                if self.links is not None and entry.what is not None and groups:
                    # the shortest wait over every node: the collective's own time
                    members = groups.get(group, ("", ()))[1]
                    self.links.add(group, entry.what[0], entry.what[1], members,
                                   entry.lows[0][0] / 1e6, (callsites or {}).get(group))

    def _merge(self, lows: list[tuple], second: int) -> None:
        self.merged += 1
        lows.sort()
        low, rank, own_next, host = lows[0]
        others = lows[1][0] if len(lows) > 1 else None
        nxt = min(x for x in (own_next, others) if x is not None) if (
            own_next is not None or others is not None) else None
        if nxt is not None:
            series = self.ranks.get(rank)
            if series is None:
                series = self.ranks[rank] = _Series()
            series.add(second, (nxt - low) / 1e6)
        if others is not None and lows[1][3] != host:
            series = self.nodes.get(host)
            if series is None:
                series = self.nodes[host] = _Series()
            series.add(second, (others - low) / 1e6)

    # --- verdicts ----------------------------------------------------------------------
    def _late(self, series: _Series, steps_of, now_s: float) -> tuple | None:
        """(ms per step or second, which, times last, t) when the series says late."""
        xs, buckets, times = series.window(int(now_s))
        total = sum(xs)
        if total < self.min_lateness_ms or buckets < MIN_BUCKETS:
            return None  # the quick no of thousands of ranks a second
        steps = steps_of()
        per = steps / WINDOW_S if steps > 0 else 1.0  # steps per second
        ms_per_step = total / WINDOW_S / per
        t = _t(xs)
        if ms_per_step >= self.min_lateness_ms and t >= MIN_T:
            return ms_per_step, "step" if steps > 0 else "second of the job", times, t
        return None

    def findings(self, now_s: float, host_of: dict, steps_of) -> list[Finding]:
        """Current stragglers; `host_of`: rank -> host; `steps_of(ranks)`: steps those
        ranks finished over the window (their mean)."""
        late_ranks = {}
        for r, series in self.ranks.items():
            got = self._late(series, lambda r=r: steps_of([r]), now_s)
            if got is not None:
                late_ranks[r] = got
        by_host: dict[str, list[int]] = {}
        for r in late_ranks:
            by_host.setdefault(host_of.get(r, "?"), []).append(r)
        late_nodes = {}
        for host, series in self.nodes.items():
            got = self._late(series, lambda h=host: steps_of(_ranks_on(host_of, h)), now_s)
            if got is not None:
                late_nodes[host] = got
        out = []
        for host in sorted(set(by_host) | set(late_nodes)):
            ranks = sorted(by_host.get(host, ()))
            if len(ranks) == 1:  # one rank the node waits for too: the rank, not the node
                out.append(_rank_finding(ranks[0], host, *late_ranks[ranks[0]]))
            elif ranks:  # several late each in its own group (one rank a node in each)
                out.append(_node_finding(host, ranks, *max(late_ranks[r] for r in ranks)))
            else:  # its ranks late together, none beside the others
                out.append(_node_finding(host, _ranks_on(host_of, host), *late_nodes[host]))
        return out


def _ranks_on(host_of: dict, host: str) -> list[int]:
    return sorted(r for r, h in host_of.items() if h == host)


def _t(xs: list[float]) -> float:
    n = len(xs)
    mean = sum(xs) / n
    var = sum((x - mean) ** 2 for x in xs) / (n - 1) if n > 1 else 0.0
    if var <= 0:
        return math.inf if mean > 0 else 0.0
    return mean / math.sqrt(var / n)


REMEDY = ("look at what this rank does between collectives that the others do not: its "
          "data loading (`distdoctor diagnose` on its node's run dir says where its steps "
          "go), its GPU's clocks and temperature (throttling), other processes on its host")
NODE_REMEDY = ("the whole node is slow, not one GPU: compare its host with the others "
               "(CPU load, the input pipeline's storage or network, the NIC's link speed, "
               "a GPU driver or clock setting); `distdoctor diagnose` on its run dir says "
               "where its steps go")


def _rank_finding(rank: int, host: str, ms: float, per: str, last: int,
                  t: float) -> Finding:
    return Finding(
        kind="straggler", severity="warning", ranks=[rank],
        summary=(f"straggler: rank {rank} (node {host}) keeps the ranks on other nodes "
                 f"waiting {ms:.1f} ms per {per} (last to arrive in {last} cross-node "
                 f"collectives over the last {WINDOW_S} s)"),
        remedy=REMEDY, details=_details(host, ms, per, last, t))


def _node_finding(host: str, ranks: list[int], ms: float, per: str, last: int,
                  t: float) -> Finding:
    from distdoctor.diagnosis.report import rank_ranges

    return Finding(
        kind="straggler", severity="warning", ranks=ranks,
        summary=(f"straggler: node {host} (ranks {rank_ranges(ranks)}) keeps the other "
                 f"nodes waiting {ms:.1f} ms per {per}, its ranks late together (last to "
                 f"arrive in {last} cross-node collectives over the last {WINDOW_S} s)"),
        remedy=NODE_REMEDY, details=_details(host, ms, per, last, t))


def _details(host: str, ms: float, per: str, last: int, t: float) -> dict:
    return {"source": "digests", "host": host, "lateness_ms": round(ms, 3), "per": per,
            "times_last": last, "t": round(t, 2) if math.isfinite(t) else None}
