"""What `distdoctor watch` shows: one consistent picture of a running job.

Taken from the live engine between two of its passes (under its lock), as plain data: the
dashboard only draws it, and `watch --once` prints the same picture without a terminal UI.
Per rank: where it is (inside which collective, for how long, or outside any), what it
finished last, how fast it issues collectives, how late it keeps the others, its process
and GPU readings. Per group: how far each rank got, so a rank that fell behind shows.
"""

from __future__ import annotations

import copy
import os
import time
from dataclasses import dataclass, field, replace

from distdoctor.findings import FINDINGS_FILE, Finding, merge_findings, read_findings, site_text
from distdoctor.runlog.unpack import shown  # a pack read: named as the user gave it
from distdoctor.views.probe_columns import with_probes
from distdoctor.views.rank import RankRow, judged_states, rank_state, split_text

RECENT_SHOWN = 12  # a rank's newest ops in its detail


@dataclass(frozen=True)
class OpRow:
    """One of a rank's newest ops, for the dashboard's rank detail."""

    index: int  # the rank's event number
    op: str
    group: str
    seq: int
    tensors: str  # "float32[1024]", the first few
    status: str  # ok | error | timeout | in_flight
    ms: float | None  # how long it took, or has been in flight so far
    callsite: str | None


@dataclass(frozen=True)
class GroupRow:
    group: str
    desc: str
    ranks: tuple[int, ...]  # global ranks, as far as known
    issued: dict[int, int]  # rank -> collectives it issued in this group
    newest: int  # the most any member issued
    behind: tuple[int, ...]  # members more than one collective short of `newest`


@dataclass(frozen=True)
class JobSnapshot:
    run_dir: str
    command: str | None
    world_size: int | None
    state: str  # waiting for ranks | running | finished
    elapsed_s: float | None
    ranks: list[RankRow]
    groups: list[GroupRow]
    findings: list[Finding]
    events: int  # events ingested so far
    notes: list[str] = field(default_factory=list)
    recent: dict[int, list[OpRow]] = field(default_factory=dict)  # detail_rank's newest ops

    @property
    def counts(self) -> dict[str, int]:
        out = {"error": 0, "warning": 0, "info": 0}
        for f in self.findings:
            out[f.severity] = out.get(f.severity, 0) + 1
        return out


def _recent(steps) -> dict | None:
    return steps.recent() if steps is not None else None


class SnapshotTaker:
    """Takes snapshots of one `LiveDiagnosis`; remembers what it needs between them (the
    groups seen, the previous counts for rates, the owner's findings file)."""

    def __init__(self, live, clock=time.monotonic, fleet=None):
        """`fleet`: the collector's FleetEngine, whose ranks (their nodes send digests,
        not events) are shown beside those the live engine follows."""
        self.live = live
        self.fleet = fleet
        self.clock = clock
        self._groups: dict[str, tuple[str, tuple[int, ...]]] = {}
        self._prev: tuple[float, dict[int, int]] | None = None
        self._written: list[Finding] = []
        self._written_mtime: int | None = None
        self._notes: list[str] = []
        self.detail_rank: int | None = None  # whose newest ops the snapshot carries
        self._job: tuple[str | None, int | None, float | None] | None = None  # run.json

    def take(self) -> JobSnapshot:
        live = self.live
        with live._lock:  # the live thread changes all of this between its passes
            now = self.clock()
            engine = live.engine
            views = engine.views(now)
            found = copy.deepcopy(live.findings())  # merged and drawn outside the lock
            ranks = self._rank_rows(engine, views, now)
            groups = self._group_rows(engine)
            events = engine.ingested
            samples = list(engine.samples)[-64:]
            ops = (live.recent or {}).get(self.detail_rank, {})
            recent = ({self.detail_rank: [_op_row(ops[i], views.get(self.detail_rank))
                                          for i in sorted(ops)[-RECENT_SHOWN:]]}
                      if ops else {})
        if self.fleet is not None and self.fleet.positions:
            ranks, groups = self._with_fleet(ranks, groups, now)
        ranks = with_probes(ranks, samples)
        findings = _ordered(merge_findings(found, self._written_findings()))
        ranks = _with_stuck_lines(ranks, findings)
        cmd, world, started = self._job_info()
        return JobSnapshot(
            run_dir=shown(live.run_dir), command=cmd, world_size=world,
            state=_job_state(live.run_dir, ranks, world),
            elapsed_s=None if started is None else max(0.0, time.time() - started),
            ranks=ranks, groups=groups, findings=findings,
            events=events, notes=[shown(n) for n in list(self._notes)
                                  + ([live.error] if live.error else [])
                                  + sorted(set(live.follower.unreadable.values()))[:8]],
            recent=recent)

    def _job_info(self) -> tuple[str | None, int | None, float | None]:
        """(command, world size, start time) from run.json, which is written once when
        the job starts: read until it is there, then kept."""
        if self._job is None:
            meta = _run_meta(self.live.run_dir)
            if not meta:
                return None, None, None
            cmd = meta.get("command")
            if isinstance(cmd, list):
                cmd = " ".join(map(str, cmd))
            world = meta.get("world_size")
            self._job = (cmd if isinstance(cmd, str) else None,
                         world if isinstance(world, int) else None, _started(meta))
        return self._job

    # --- pieces ------------------------------------------------------------------------
    def _rates(self, counts: dict[int, int], now: float) -> dict[int, float]:
        """Collectives a second per rank since the previous snapshot."""
        rates: dict[int, float] = {}
        if self._prev is not None and now > self._prev[0]:
            dt = now - self._prev[0]
            rates = {r: (n - self._prev[1].get(r, 0)) / dt for r, n in counts.items()}
        return rates

    def _with_fleet(self, ranks: list[RankRow], groups: list[GroupRow], now: float):
        """The digests' ranks added to the rows, and their counts to the groups."""
        from distdoctor.views import fleet_view

        fleet = self.fleet
        here = {r.rank for r in ranks}
        issued = {r: g for r, g in fleet_view.issued(fleet).items() if r not in here}
        counts = {r: sum(g.values()) for r, g in issued.items()}
        rates = self._rates(counts, now)
        self._prev = (now, {**self._prev[1], **counts} if self._prev else counts)
        rows = sorted(ranks + fleet_view.rank_rows(fleet, now, here, rates),
                      key=lambda row: row.rank)
        with fleet.lock:
            for g, value in fleet.groups.items():
                self._groups.setdefault(g, value)
        by_group: dict[str, dict[int, int]] = {g.group: dict(g.issued) for g in groups}
        for r, per in issued.items():
            for g, n in per.items():
                by_group.setdefault(g, {})[r] = n
        return rows, self._group_rows_of(by_group)

    def _rank_rows(self, engine, views, now: float) -> list[RankRow]:
        counts = {r: sum(st.issued.values()) for r, st in engine.ranks.items()}
        rates = self._rates(counts, now)
        self._prev = (now, counts)
        meta = self.live.follower.meta_of(self.live.follower.newest)
        rows = []
        late_why = {r: f.summary for f in engine.found.values() if f.kind == "straggler"
                    for r in f.ranks}  # rank -> the straggler finding that blames it
        judged = judged_states(engine.found.values())
        for r in sorted(engine.ranks):
            st, view = engine.ranks[r], views[r]
            m = meta.get(r) or {}
            for ev in (st.latest, st.last_done):
                if ev is not None and ev.group not in self._groups:
                    self._groups[ev.group] = (ev.group_desc, ev.group_ranks)
            state, where, site = rank_state(view, st.exit is not None and st.exit.failed,
                                            engine.heartbeat_age_s(r, now),
                                            engine.hang_timeout_s, judged)
            score = engine.straggler.score(r)
            rows.append(RankRow(
                rank=r, host=m.get("host"), pid=m.get("pid") if isinstance(m.get("pid"), int)
                else None, state=state, where=where, callsite=site,
                last_done=(f"{st.last_done.op} #{st.last_done.seq} ({st.last_done.group})"
                           if st.last_done is not None else None),
                collectives=counts[r], rate=rates.get(r), span=st.newest_span,
                lateness_ms=score["step_lateness_ms"] if score else None,
                step_split=split_text(_recent(engine.straggler.time.get(r))),
                straggler=late_why.get(r)))
        return rows

    def _group_rows(self, engine) -> list[GroupRow]:
        issued: dict[str, dict[int, int]] = {}
        for r, st in engine.ranks.items():
            for g, n in st.issued.items():
                issued.setdefault(g, {})[r] = n
        return self._group_rows_of(issued)

    def _group_rows_of(self, issued: dict[str, dict[int, int]]) -> list[GroupRow]:
        """group -> rank -> collectives issued, as rows naming who fell behind."""
        rows = []
        for g in sorted(issued, key=_group_order):
            desc, members = self._groups.get(g, ("", ()))
            counts = issued[g]
            newest = max(counts.values())
            # one short is normal (a rank entered a collective the others have not yet)
            behind = tuple(sorted(r for r, n in counts.items() if n < newest - 1) +
                           sorted(r for r in members if r not in counts and newest > 1))
            rows.append(GroupRow(g, desc, tuple(members) or tuple(sorted(counts)), counts,
                                 newest, behind))
        return rows

    def _written_findings(self) -> list[Finding]:
        """The owner's findings.json (`distdoctor run`): re-read when it changes."""
        path = self.live.run_dir / FINDINGS_FILE
        try:
            mtime = os.stat(path).st_mtime_ns
        except OSError:
            return self._written
        if mtime != self._written_mtime:
            self._written_mtime = mtime
            try:
                self._written = read_findings(self.live.run_dir)
                self._notes = []
            except (OSError, ValueError) as exc:
                self._notes = [f"{path} is unreadable ({exc}); showing this view's own findings"]
        return self._written


def _op_row(ev, view) -> OpRow:
    tensors = ", ".join(f"{d}{list(shape)}" for shape, d in zip(ev.shapes[:2], ev.dtypes[:2],
                                                                  strict=False))
    if len(ev.shapes) > 2:
        tensors += f", +{len(ev.shapes) - 2}"
    ms = (ev.duration_ms if ev.t_end_ns is not None else
          view.waited_s(ev) * 1e3 if view is not None else None)
    return OpRow(ev.index, ev.op, ev.group, ev.seq, tensors, ev.status, ms, site_text(ev.callsite))


def _with_stuck_lines(rows: list[RankRow], findings: list[Finding]) -> list[RankRow]:
    """A rank a hang waits for while it is in no collective: its line is where its stack
    says it is (taken by the owner with py-spy), not the last collective it left."""
    stuck = {}
    for f in findings:
        if f.kind in ("hang", "deadlock"):
            for cs in f.callsites:
                if cs.get("source") == "stack" and cs.get("rank") in f.ranks:
                    stuck.setdefault(cs["rank"], cs)
    if not stuck:
        return rows
    out = []
    for row in rows:
        cs = stuck.get(row.rank)
        if cs is not None and row.state in ("running", "no heartbeat"):
            fn = f", in {cs['function']}" if cs.get("function") else ""
            row = replace(row, callsite=site_text(cs), where=f"{row.where}{fn}")
        out.append(row)
    return out


def _run_meta(run_dir) -> dict:
    from distdoctor.privatefiles import read_json
    from distdoctor.runlog.rundir import MAX_RUN_META_BYTES

    try:  # (within bounds, never a wait on a FIFO: runlog.rundir)
        data = read_json(run_dir / "run.json", MAX_RUN_META_BYTES)
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def _started(meta: dict) -> float | None:
    """The job's start (run.json's "created") as a Unix time."""
    created = meta.get("created")
    if not isinstance(created, str):
        return None
    from datetime import datetime

    try:
        return datetime.strptime(created, "%Y-%m-%dT%H:%M:%S%z").timestamp()
    except ValueError:
        return None


def _job_state(run_dir, ranks: list[RankRow], world: int | None) -> str:
    if (run_dir / "exits.json").exists():
        return "finished"
    if not ranks:
        return "waiting for ranks"
    if all(r.state in ("exited", "failed") for r in ranks) and (world is None or
                                                               len(ranks) >= world):
        return "finished"
    return "running"


def _group_order(g: str):
    return (0, int(g)) if g.isdigit() else (1, g)


_SEVERITY_ORDER = {"error": 0, "warning": 1, "info": 2}


def _ordered(findings: list[Finding]) -> list[Finding]:
    return sorted(findings, key=lambda f: _SEVERITY_ORDER.get(f.severity, 3))
