"""One rank as the views show it, wherever its events are read (followed here by the live
engine, snapshot.py and rank_metrics.py, or sent by its node in digests, fleet_view.py):
the dashboard's row and the state it words (`RankRow`, `rank_state`), and the values
`/metrics` reports of it (`RankMetrics`, `rank_metrics`)."""

from __future__ import annotations

from dataclasses import dataclass

from distdoctor.diagnosis.engine.core import SPLIT
from distdoctor.findings import site_text

HEARTBEAT_LATE_S = 3.0  # heartbeats come every second; this long without one is news
_BOUND = float(1 << 63)  # a value past this is no reading (the collector refuses them)


def is_value(x) -> bool:
    """A number a view may print or export: an int or float (not a bool), finite and
    within 64 bits. What a node sends is checked as it comes (collect/digest_fields.py);
    the views, which never import collect, render defensively too (a 400-digit int made
    every /metrics scrape a 500 for good)."""
    return type(x) in (int, float) and -_BOUND < x < _BOUND


@dataclass(frozen=True)
class RankRow:
    rank: int
    host: str | None
    pid: int | None
    state: str  # starting | running | in collective | hung | no heartbeat | exited | failed
    where: str  # what the state is about: "all_reduce #41 in group 0 for 2.1 s", an exit
    callsite: str | None  # file:line of the op in flight, or of the last one finished
    last_done: str | None  # "all_reduce #40 (0)"
    collectives: int  # issued so far, over all its groups
    rate: float | None  # collectives per second since the previous snapshot
    span: str | None  # the span it began last ("step 12")
    lateness_ms: float | None  # mean per-step lateness (straggler score), when scored
    cpu_pct: float | None = None
    rss_bytes: int | None = None
    gpu: str | None = None  # "71 C 1980 MHz 96%", from the probe samples
    # where its recent steps go: "42.1 ms a step: collectives 4.4, data 34.2, compute 3.5"
    step_split: str | None = None
    straggler: str | None = None  # the straggler finding that blames it, if any


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


def split_text(b: dict | None) -> str | None:
    """Where a rank's last finished steps went (RankSteps.recent, diagnosis/stragglers/steptime.py)."""
    if b is None:
        return None
    return (f"{b['wall_ms']:.1f} ms a step (last {b['steps']}): collectives "
            f"{b['collective_ms']:.1f}, data {b['data_ms']:.1f}, compute {b['compute_ms']:.1f}")


def _op_text(ev) -> str:
    return f"{ev.op} #{ev.seq} in group {ev.group}"


def judged_states(findings) -> dict[int, str]:
    """rank -> "hung" or "long wait", as the current findings judge it: while a hang or
    deadlock stands, every rank blocked in a collective is hung (-1: any rank); the
    busy rank of a long wait in flight keeps the others waiting, a state."""
    out: dict[int, str] = {}
    for f in findings:
        if f.kind in ("hang", "deadlock") and f.severity == "error":
            out[-1] = "hung"
        elif f.kind == "long_wait" and f.details.get("in_flight"):
            for r in f.ranks:
                out.setdefault(r, "long wait")
    return out


def rank_state(view, failed: bool, hb_age_s: float | None,
               hang_timeout_s: float | None,
               judged: dict[int, str] | None = None) -> tuple[str, str, str | None]:
    """(state, what it is doing, call site) of one rank, from its RankView (hang.py);
    `failed`: its exit, if it has one, is a failure; `judged`: judged_states()."""
    judged = judged or {}
    latest = view.latest
    site = site_text(latest.callsite) if latest is not None else None
    if view.exit is not None:
        return ("failed" if failed else "exited"), view.exit, site
    if hb_age_s is not None and hb_age_s > HEARTBEAT_LATE_S:  # frozen, or dead unseen
        return "no heartbeat", f"none for {hb_age_s:.0f} s", site
    if latest is None:
        return "starting", "no collective yet", None
    if latest.t_end_ns is None:
        waited = view.waited_s(latest)
        hung = judged.get(-1) == "hung" or (hang_timeout_s is not None
                                            and waited >= hang_timeout_s)
        state = "hung" if hung else "in collective"
        return state, f"{_op_text(latest)} for {waited:.1f} s", site
    since = ""
    if view.now_ns is not None and latest.t_end_ns:
        since = f" for {max(0.0, (view.now_ns - latest.t_end_ns) / 1e9):.1f} s"
    if judged.get(view.rank) == "long wait":
        return "long wait", f"keeps others waiting, outside collectives{since}", site
    return "running", f"outside collectives{since}", site


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
        steps=steps if type(steps) is int and is_value(steps) else 0,
        step_s=split["wall_ms"] / 1e3 if split else None,
        late_s=max(0.0, late) / 1e3 if is_value(late) else None)


def summary_split(summary: dict) -> dict | None:
    """A rank summary's step breakdown, when it is whole."""
    split = summary.get("split")
    if isinstance(split, dict) and all(is_value(split.get(k)) for k in SPLIT):
        return split
    return None


def _is_done(d) -> bool:
    return (isinstance(d, list) and len(d) == 5 and all(isinstance(x, str) for x in d[:3])
            and all(is_value(x) for x in d[3:]))
