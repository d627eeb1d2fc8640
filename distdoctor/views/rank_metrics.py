"""What `/metrics` reports of a job, as plain values: each rank's state, time in its
collective, heartbeat age, collectives done, steps and lateness, whether its events are
followed here (the live engine) or its node sends digests (fleet_view.py); the current
findings; the newest probe samples. export/metrics.py only names and renders them."""

from __future__ import annotations

from dataclasses import dataclass

from distdoctor.diagnosis.engine import SPLIT
from distdoctor.findings import Finding
from distdoctor.views.snapshot import judged_states, rank_state


@dataclass(frozen=True)
class RankMetrics:
    """One rank's values, whether its events are followed here or its node sends them
    in digests."""

    rank: int
    host: str
    state: str  # as the dashboard words it
    in_collective_s: float
    heartbeat_age_s: float | None
    done: list  # [group, group desc, op, count, seconds]
    steps: int
    step_s: float | None
    late_s: float | None


@dataclass(frozen=True)
class JobMetrics:
    """The job at one moment, read under the live engine's lock."""

    ranks: list[tuple[object, RankMetrics]]  # (local rank from run.json or None, values)
    findings: list[Finding]  # the live engine's, then the collector's it lacks
    ingested: int  # events the live engine has read
    samples: list  # the newest probe samples, oldest first


def job_metrics(live, now_s: float, fleet=None) -> JobMetrics:
    """Every rank's values and the findings, from the live engine (`live`: LiveDiagnosis)
    and `fleet`, the collector's engine, for the ranks whose nodes send digests."""
    ranks: list[tuple[object, RankMetrics]] = []
    with live._lock:
        engine = live.engine
        meta = live.follower.meta_of(live.follower.newest)
        views = engine.views(now_s)
        judged = judged_states(engine.found.values())
        for r in sorted(engine.ranks):
            m = meta.get(r) or {}
            summary = engine.rank_summary(r, now_s)
            state, _, _ = rank_state(views[r], summary["failed"], summary["hb_age_s"],
                                     engine.hang_timeout_s, judged)
            ranks.append((m.get("local_rank"), rank_metrics(
                r, _text(m.get("host")), state, views[r], summary, summary["hb_age_s"])))
        here = set(engine.ranks)
        findings = live.findings()
        ingested = sum(e.ingested for e in live.engines.values())
        samples = list(engine.samples)[-64:]
    if fleet is not None:
        from distdoctor.views.fleet_view import metric_ranks

        for rm in metric_ranks(fleet, now_s, here):
            ranks.append(((meta.get(rm.rank) or {}).get("local_rank"), rm))
        have = {f.key for f in findings}
        findings = findings + [f for f in fleet.findings() if f.key not in have]
    return JobMetrics(ranks, findings, ingested, samples)


def rank_metrics(rank: int, host: str, state: str, view, summary: dict,
                 hb_age: float | None) -> RankMetrics:
    """A rank's values from its RankView and its summary (Engine.rank_summary, here or
    on its node); fields a digest sent malformed are left out."""
    latest = view.latest
    split = summary_split(summary)
    late, steps, done = summary.get("late_ms"), summary.get("steps"), summary.get("done")
    return RankMetrics(
        rank=rank, host=host, state=state,
        in_collective_s=(view.waited_s(latest)
                         if latest is not None and latest.t_end_ns is None else 0.0),
        heartbeat_age_s=hb_age,
        done=[d for d in done if _is_done(d)] if isinstance(done, list) else [],
        steps=steps if isinstance(steps, int) else 0,
        step_s=split["wall_ms"] / 1e3 if split else None,
        late_s=max(0.0, late) / 1e3 if isinstance(late, (int, float)) else None)


def summary_split(summary: dict) -> dict | None:
    """A rank summary's step breakdown, when it is whole."""
    split = summary.get("split")
    if isinstance(split, dict) and all(isinstance(split.get(k), (int, float)) for k in SPLIT):
        return split
    return None


def _is_done(d) -> bool:
    return (isinstance(d, list) and len(d) == 5 and all(isinstance(x, str) for x in d[:3])
            and all(isinstance(x, (int, float)) for x in d[3:]))


def _text(value) -> str:
    return "" if value is None else str(value)
