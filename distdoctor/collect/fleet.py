"""The collector's diagnosis from the nodes' digests (collect/digest.py): a job of
thousands of ranks, followed live without reading every event of every rank.

- Hangs and deadlocks: each rank's position (its newest op, its newest finished op, what
  it issued per group, its clock) and its progress as its own node read it (CPU, I/O,
  sampled line) come with every digest. The ops still in flight make the open
  rendezvous, and diagnosis/hangs/hang.py finds the stuck ones, who never joined and the
  cycles, as it does on one node. A node whose digests come late is a state (a `host`
  finding, once), never a hang: its ranks are judged on their own positions when its
  reports resume, and waits are never extrapolated far past what a node reported.
- Mismatches: the nodes report each collective once per signature with the ranks that
  entered it. Two signatures of one (group, seq) that differ (mismatch.py) are a
  mismatch after SETTLE_S (time for the other nodes' reports); mismatch.py words it.
- Stragglers across nodes: from the waits the nodes report (collect/lateness.py), and
  slow links between nodes from the same waits (collect/links.py).
- A node that falls silent while the others wait for its ranks: its ranks are not judged
  on their stale positions here; the collector names the node lost (collect/lost.py,
  from `lost_positions`).

What it keeps is bounded: one position per rank (position.py), and the collectives still
open (each forgotten once every member reported it). The signatures and the open
collectives are shared by the nodes (shares.py): past MAX_SIGNATURES or MAX_OPEN the
node that holds the most goes, or, where that is the node itself, its own oldest.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import replace

from distdoctor.collect import digest_fields as fields
from distdoctor.collect.digest import MAX_WAITS, row_event
from distdoctor.collect.lateness import WINDOW_S, FleetLateness
from distdoctor.collect.limits import MAX_RANKS
from distdoctor.collect.position import RankPosition, finished_callsites
from distdoctor.collect.reports import MORE, NodeReports, sent_progress
from distdoctor.collect.shares import (
    MAX_GROUP_MEMBERS,
    MAX_GROUPS,
    MAX_OPEN,
    MAX_SIGNATURES,
    MAX_SIGS_PER_NODE,
    GroupShares,
    SigShares,
    open_room,
)
from distdoctor.collect.wire import WireError
from distdoctor.diagnosis.hangs.hang import RankView, hang_findings
from distdoctor.diagnosis.hangs.progress import UNKNOWN, Policy, Verdict
from distdoctor.diagnosis.mismatches.mismatch import mismatch_finding
from distdoctor.diagnosis.rendezvous import Rendezvous, key_of
from distdoctor.findings import Finding

SETTLE_S = 1.0
STALE_S = 10.0  # a node silent this long: its ranks' clocks are no longer moved on
AHEAD_S = 2.0  # a rank's clock is moved on at most this far past its node's report
MAX_RUN = 1 << 16  # collectives in one run of a digest
__all__ = ["MAX_GROUPS", "MAX_GROUP_MEMBERS", "MAX_OPEN", "MAX_SIGNATURES", "FleetEngine"]


class _Open:
    """One collective as the nodes reported it: signature -> the ranks that entered."""

    __slots__ = ("host", "sigs", "count", "since_s", "reported")

    def __init__(self, host: str):
        self.host = host  # the node that opened it: its share of MAX_OPEN
        self.sigs: dict[int, list[int]] = {}  # signature number -> ranks
        self.count = 0
        self.since_s: float | None = None  # when two signatures were first seen
        self.reported = False


class FleetEngine:
    stale_s = STALE_S  # for the views (views/fleet_view.py), which never import collect

    def __init__(self, hang_timeout_s: float | None = None, settle_s: float = SETTLE_S,
                 links=None):
        """`hang_timeout_s`: None decides hangs by the ranks' progress, a number by that
        fixed timeout; `links`: the collector's LinkWatch (links.py), fed the cross-node
        collectives' own times."""
        self.hang_timeout_s = hang_timeout_s
        self.policy = Policy(hang_timeout_s)
        self.reports = NodeReports()
        self.settle_s = settle_s
        self.lock = threading.Lock()
        # group -> (description, members), group -> members: each charged to a node
        self.book = GroupShares()
        self.groups, self.sizes = self.book.groups, self.book.sizes  # (never rebound)
        self.evicted = self.book.evicted  # nodes let go to make room (shares.py)
        # a node numbers its signatures; the collector numbers the distinct ones
        # (mismatch.signature), so equal signatures from different nodes are one number
        self.sigs = SigShares(self.evicted)
        self.positions: dict[int, RankPosition] = {}
        self.open: dict[tuple, _Open] = {}
        self.found: dict[tuple, Finding] = {}
        self._changed: list[Finding] = []
        self.links = links
        self.lateness = FleetLateness(links=links)
        self.version = 0  # rises whenever findings() would say something else
        self._judged_s = 0.0
        # rank -> (second, steps finished) as its digests said, the newest WINDOW_S + 2
        self._steps: dict[int, deque] = {}
        self.digests = 0
        self.arrivals = 0

    # --- input -------------------------------------------------------------------------
    def apply(self, payload: dict, now_s: float | None = None,
              members_of: dict[int, str] | None = None) -> None:
        """One node's digest (a DIGEST frame's JSON); WireError when it is malformed or past
        a bound (limits.py), and then nothing of it is kept. `members_of`: rank -> its
        owner's host (a node reports its own ranks' arrivals only)."""
        now_s = time.monotonic() if now_s is None else now_s
        host = payload.get("host")
        groups, sigs = payload.get("groups"), payload.get("sigs")
        ranks, arrivals = payload.get("ranks"), payload.get("arrivals")
        if not (isinstance(host, str) and isinstance(groups, dict) and isinstance(sigs, dict)
                and isinstance(ranks, list) and isinstance(arrivals, list)):
            raise WireError("DIGEST frame lacks host, groups, sigs, ranks or arrivals")
        waits = fields.waits_of(payload.get("waits", []))
        if len(sigs) > MAX_SIGS_PER_NODE or len(waits) > MAX_WAITS:  # (than a node makes)
            raise WireError("DIGEST frame of too many signatures or waits")
        # every part checked whole before any of it is kept (digest_fields.py)
        new_groups = fields.groups_of(groups)
        runs = fields.arrivals_of(arrivals, host, members_of)
        items = [fields.position_of(item) for item in ranks]
        sig_rows = fields.sig_numbers(sigs)
        for row in sig_rows.values():
            fields.check_row(row)
        with self.lock:
            self.sigs.room(host, sig_rows)
            self.book.take(host, new_groups)
            new_sigs = {n: row_event(-1, row, self.groups) for n, row in sig_rows.items()}
            positions = {}
            for rank, latest, last_done, issued, now_ns, exit_, stopped, state in items:
                positions[rank] = RankPosition(host, rank, latest, last_done, issued, now_ns,
                                               now_s, exit_, stopped, self.groups, state)
            self.sigs.add(host, new_sigs)
            self.positions.update(positions)
            mine = self.sigs.of.get(host, {})
            for group, seq, sig, rs, count in runs:  # runs: digest.runs
                number = mine.get(sig)
                if number is None or count > MAX_RUN:
                    continue  # a signature this collector no longer holds
                self._arrive_run(host, group, seq, count, number, rs, now_s)
            self.lateness.add(host, waits, self.sizes, now_s, self.groups,
                              finished_callsites(positions.values()) if waits else None)
            self._count_steps(positions.values(), now_s)
            self._reported(host, now_s)
            self.digests += 1

    def forget(self, ranks) -> None:
        """Ranks whose node was let go to make room (shares.py): no position kept."""
        with self.lock:
            for r in ranks:
                self.positions.pop(r, None)
                self._steps.pop(r, None)

    def _reported(self, host: str, now_s: float) -> None:
        late = self.reports.came(host, now_s)
        if late is not None and late.details["host"] == MORE and ("host", MORE) in self.found:
            self.found["host", MORE] = late  # (their count: said once, kept up to date)
            self.version += 1
        elif late is not None:
            self._put(("host", late.details["host"]), late)

    def late_hosts(self, now_s: float) -> set[str]:
        return self.reports.late(now_s)

    def _count_steps(self, positions, now_s: float) -> None:
        second = int(now_s)
        for p in positions:
            steps = p.state.get("steps")
            if not isinstance(steps, int):
                continue
            hist = self._steps.get(p.rank)
            if hist is None:
                hist = self._steps[p.rank] = deque(maxlen=WINDOW_S + 2)
            if not hist or hist[-1][0] != second:
                hist.append((second, steps))

    def steps_of(self, ranks, now_s: float) -> float:
        """The mean of the steps `ranks` finished over the lateness window (0: unknown)."""
        start, done = int(now_s) - WINDOW_S, []
        for r in ranks:
            hist = self._steps.get(r)
            if hist:
                before = [n for s, n in hist if s <= start] or [hist[0][1]]
                done.append(hist[-1][1] - before[-1])
        return sum(done) / len(done) if done else 0.0

    def _arrive_run(self, host: str, group: str, seq: int, count: int, sig: int,
                    ranks: list[int], now_s: float) -> None:
        """`count` collectives of `group` from `seq` on, entered by `ranks`: one open entry
        each. A run of the whole group is complete and agrees: only collectives already
        open are gone through. The loop is written out, with the group's size looked up
        once: a group spanning 1,000 nodes brings a million such arrivals a second at
        100,000 ranks, where a call and a lookup apiece were half the collector's CPU."""
        size = self.sizes.get(group, 0)
        opened = self.open
        keys = [(group, s) for s in range(seq, seq + count)]
        if size and len(ranks) >= size and len(set(ranks)) >= size:
            keys = [k for k in keys if k in opened]
        self.arrivals += count
        full, n = size or MAX_RANKS, len(ranks)
        for key in keys:
            entry = opened.get(key)
            if entry is None:
                if len(opened) >= MAX_OPEN:  # full: the biggest holder goes (shares.py)
                    open_room(opened, host, self.evicted)
                entry = opened[key] = _Open(host)
            known = entry.sigs.get(sig)
            if known is None:
                entry.sigs[sig] = known = []
                if len(entry.sigs) > 1 and entry.since_s is None:  # two signatures: they differ
                    entry.since_s = now_s
            if entry.count >= full:
                continue  # sent again and again: a member list never grows past its group
            known.extend(ranks)
            entry.count += n
            if size and entry.count >= size and entry.since_s is None:
                del opened[key]  # everyone came, and agreed

    # --- analysis ----------------------------------------------------------------------
    def _now_ns(self, p: RankPosition, now_s: float) -> int | None:
        """The rank's clock now: as its node last said, moved on since by at most
        AHEAD_S (a late node's waits do not grow while it is silent)."""
        if p.now_ns is None or p.exit is not None or now_s - p.got_s > STALE_S:
            return p.now_ns
        return p.now_ns + int(min(now_s - p.got_s, AHEAD_S) * 1e9)

    def views(self, now_s: float) -> dict[int, RankView]:
        out = {}
        for r, p in self.positions.items():
            latest, last_done = p.ops()
            clean = p.exit is not None and not p.stopped and not p.state.get("failed")
            out[r] = RankView(r, latest, last_done, self._now_ns(p, now_s), p.exit, p.issued,
                              p.stopped, clean)
        return out

    def judge(self, rank: int, rv, waited_s: float, now_s: float) -> Verdict:
        """A rank others wait for, by the progress its own node read and sent."""
        p = self.positions.get(rank)
        if p is None:
            return self.policy.judge(waited_s, UNKNOWN, None, False, None)
        progress, fixed, in_data = sent_progress(p.state.get("progress"),
                                                 min(now_s - p.got_s, AHEAD_S))
        return self.policy.judge(waited_s, progress, fixed, in_data, None)

    def _anything_stuck(self, now_s: float) -> bool:
        """Whether a rank's newest op has been in flight past the timeout, or a moment
        when judged by progress (or failed): only then are the positions decoded and
        the hang detector run."""
        timeout = self.policy.confirm_s()
        return any(p.stuck_s(self._now_ns(p, now_s)) >= timeout
                   for p in self.positions.values())

    def tick(self, now_s: float | None = None) -> list[Finding]:
        """The findings new or changed since the last tick."""
        now_s = time.monotonic() if now_s is None else now_s
        with self.lock:
            if self._anything_stuck(now_s):
                self._find_hangs(now_s)
            for key, entry in list(self.open.items()):
                if (entry.since_s is not None and not entry.reported
                        and now_s - entry.since_s >= self.settle_s):
                    entry.reported = True
                    f = self._mismatch(key, entry, now_s)
                    if f is not None:
                        self._put(("mismatch", key), f)
            if now_s - self._judged_s >= 1.0:
                self._judged_s = now_s
                self._find_stragglers(now_s)
            changed, self._changed = self._changed, []
            return changed

    def _find_stragglers(self, now_s: float) -> None:
        """Stragglers as the waits of the last WINDOW_S say: news when new, and kept
        after (a job that ended, or a rank that caught up, still had one), with the
        newest numbers."""
        host_of = {r: p.host for r, p in self.positions.items()}
        for f in self.lateness.findings(now_s, host_of, lambda rs: self.steps_of(rs, now_s)):
            key = ("straggler", tuple(f.ranks))
            if key in self.found:
                self.found[key] = f
            else:
                self._put(key, f)

    def _find_hangs(self, now_s: float) -> None:
        """hang.py over every rank: the open rendezvous are the ops still in flight."""
        views = self.views(now_s)
        # ranks on a node whose reports are late are not judged: their position is old,
        # nor one whose position is older than a digest or two: a node whose link went
        # down a moment ago shows its ranks where they were then (a stale op in flight
        # would even close a wait cycle with the ranks that wait for them). collect/
        # lost.py names such a node once it stays silent while the others wait for it
        late = self.late_hosts(now_s)
        unheard = {r for r, p in self.positions.items()
                   if p.host in late or now_s - p.got_s > AHEAD_S}
        in_flight: dict[tuple, Rendezvous] = {}
        for view in views.values():
            ev = view.latest
            key = key_of(ev) if ev is not None and ev.t_end_ns is None else None
            if key is None or view.rank in unheard:
                continue
            rv = in_flight.get(key)
            if rv is None:
                rv = in_flight[key] = Rendezvous.open(key, ev, now_s)
            rv.arrive(ev)

        def known(rv) -> bool:  # a stuck collective a mismatch already explains
            return ("mismatch", (rv.group, rv.seq)) in self.found

        for f in hang_findings(list(in_flight.values()), views, self.policy, unheard,
                               known=known,
                               judge=lambda r, rv, waited: self.judge(r, rv, waited, now_s)):
            if f.kind == "long_wait":
                continue  # a state: a node's own run shows it
            self._put((f.kind, tuple(f.ranks)), f)  # one finding per set of culprits

    def _mismatch(self, key: tuple, entry: _Open, now_s: float) -> Finding | None:
        group, seq = key
        desc, members = self.groups.get(group, ("", ()))
        rv = Rendezvous(("c", group, seq), group, desc, seq, members, now_s)
        for sig, ranks in entry.sigs.items():
            ev = self.sigs.events.get(sig)
            if ev is None:
                continue
            for r in ranks:
                pos = self.positions.get(r)
                latest = pos.ops()[0] if pos is not None else None
                # the rank's own line where its position still shows this collective
                own = latest if latest is not None and (latest.group, latest.seq) == key \
                    else None
                rv.arrive(replace(ev, rank=r, group_desc=desc, group_ranks=members,
                                  callsite=own.callsite if own else ev.callsite))
        return mismatch_finding(rv)

    def _put(self, key: tuple, f: Finding) -> None:
        """The first version is kept (a hang's later ones differ only in how long the
        ranks have waited): news once."""
        if key not in self.found:
            self.found[key] = f
            self._changed.append(f)
            self.version += 1

    def findings(self) -> list[Finding]:
        with self.lock:
            return list(self.found.values())

    def host_of(self) -> dict[int, str]:
        with self.lock:
            return {r: p.host for r, p in self.positions.items()}

    def lost_positions(self, now_s: float | None = None) -> dict:
        """Every rank's newest op and how long it has waited in it (lost.py)."""
        from distdoctor.collect.lost import digest_positions

        return digest_positions(self, time.monotonic() if now_s is None else now_s)
