"""The collector's picture of the ranks whose nodes send digests: the dashboard's rows and
the /metrics values, from each rank's newest position and state (collect/fleet.py), with
the same wording and states as a rank followed event by event (snapshot.py).

`fleet` is the collector's FleetEngine, handed in by the front end that runs it: the
views read its state (under its lock) and never import the collector."""

from __future__ import annotations

from distdoctor.views.rank import (
    RankMetrics,
    RankRow,
    is_value,
    judged_states,
    rank_metrics,
    rank_state,
    split_text,
    summary_split,
)


def _heartbeat_age(p, now_s: float) -> float | None:
    age = p.state.get("hb_age_s")
    if not is_value(age):
        return None
    return age + max(0.0, now_s - p.got_s)


def _state(fleet, p, view, now_s: float) -> tuple[str, str, str | None]:
    if now_s - p.got_s > fleet.stale_s and not p.exit:
        return "no heartbeat", f"its node {p.host} sent nothing for {now_s - p.got_s:.0f} s", None
    return rank_state(view, bool(p.state.get("failed")), _heartbeat_age(p, now_s),
                      fleet.hang_timeout_s, judged_states(fleet.found.values()))


def _ranks(fleet, now_s: float, skip):
    """(rank, position, RankView, (state, where, line)) of each rank the digests carry,
    but those in `skip` (followed event by event here), in rank order."""
    with fleet.lock:
        views = fleet.views(now_s)
        positions = dict(fleet.positions)
    for r in sorted(positions):
        if r not in skip:
            p, view = positions[r], views[r]
            yield r, p, view, _state(fleet, p, view, now_s)


def rank_rows(fleet, now_s: float, skip, rates: dict) -> list[RankRow]:
    """A RankRow per rank the digests carry; `rates`: rank -> collectives a second, from
    the caller's previous snapshot."""
    with fleet.lock:
        late_why = {r: f.summary for f in fleet.found.values() if f.kind == "straggler"
                    for r in f.ranks}
    rows = []
    for r, p, view, (state, where, site) in _ranks(fleet, now_s, skip):
        done = view.last_done
        late = p.state.get("late_ms")
        span = p.state.get("span")
        rows.append(RankRow(
            rank=r, host=p.host, pid=None, state=state, where=where, callsite=site,
            last_done=f"{done.op} #{done.seq} ({done.group})" if done is not None else None,
            collectives=sum(p.issued.values()), rate=rates.get(r),
            span=span if isinstance(span, str) else None,
            lateness_ms=late if is_value(late) else None,
            step_split=split_text(summary_split(p.state)), straggler=late_why.get(r)))
    return rows


def issued(fleet) -> dict[int, dict[str, int]]:
    """rank -> collectives it issued per group."""
    with fleet.lock:
        return {r: dict(p.issued) for r, p in fleet.positions.items()}


def metric_ranks(fleet, now_s: float, skip) -> list[RankMetrics]:
    """What /metrics exports of each rank the digests carry."""
    return [rank_metrics(r, p.host, state, view, p.state, _heartbeat_age(p, now_s))
            for r, p, view, (state, _, _) in _ranks(fleet, now_s, skip)]
