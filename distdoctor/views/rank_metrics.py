"""What `/metrics` reports of a job, as plain values: each rank's state, time in its
collective, heartbeat age, collectives done, steps and lateness, whether its events are
followed here (the live engine) or its node sends digests (fleet_view.py); the current
findings; the newest probe samples. export/metrics.py only names and renders them."""

from __future__ import annotations

from dataclasses import dataclass

from distdoctor.findings import Finding
from distdoctor.views.rank import RankMetrics, judged_states, rank_metrics, rank_state


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


def _text(value) -> str:
    return "" if value is None else str(value)
