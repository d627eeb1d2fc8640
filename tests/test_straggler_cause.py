"""Why a straggler is late (cause.py) on the shape a loaded 2-core CI machine recorded:
the DP x PP trainer's stage rank sleeping 40 ms a step, whose per-step lateness summed to
66 ms (its upstream stage's p2p waits and its DP peer's, one delay counted twice) while
its breakdown against its DP peer showed 30 ms of extra own work and its samples 40 ms at
the sleeping line. The summary named that line as where its time went, and details said
"unknown". Real RankSteps fed step by step, as the engine feeds them."""

from __future__ import annotations

from types import SimpleNamespace as NS

from distdoctor.diagnosis import cause
from distdoctor.diagnosis.steptime import RankSteps

MS = 1_000_000
SLEEP = {"function": "straggle", "file": "/x/faults.py", "line": 188}
FORWARD = {"function": "forward", "file": "/x/model.py", "line": 40}


def rank_steps(steps: int, wall_ms: float, coll_ms: float, sites: list[dict]) -> RankSteps:
    """A rank's `steps` step spans of `wall_ms`, `coll_ms` of it inside one collective,
    and one sample every 20 ms at each of `sites` in turn."""
    rs = RankSteps()
    t = 0
    for i in range(steps):
        key = 2 * i + 1  # a span's key is its index + 1
        for n, site in enumerate(sites):
            rs.sample(NS(t_enter_ns=t + n * 20 * MS, numel_in=0, callsite=site,
                         span_index=key))
        rs.collective(key, NS(t_enter_ns=t, t_end_ns=t + int(coll_ms * MS), group="4",
                              group_desc="mesh_dp_replicate"))
        rs.span(NS(t_enter_ns=t, t_end_ns=t + int(wall_ms * MS), implicit=False,
                   name="step", index=key - 1, span_index=0))
        t += int(wall_ms * MS)
    return rs


def test_own_work_its_samples_and_breakdown_agree_on_is_compute_not_unknown():
    # the slow rank: 30 ms more own work than its peer, two samples a step at the sleep
    slow = rank_steps(20, 150.0, 50.0, [SLEEP, SLEEP, FORWARD, FORWARD, FORWARD])
    peer = rank_steps(20, 150.0, 80.0, [FORWARD, FORWARD, FORWARD])
    keys = list(slow.steps)
    why = cause.explain(2, 66.0, keys, {2: slow, 3: peer}, {3: keys}, {"4": 1.0}, {"4"})
    assert why["breakdown"]["2"]["compute_ms"] - why["breakdown"]["3"]["compute_ms"] == 30.0
    assert why["frames"][0]["function"] == "straggle", why["frames"]
    assert why["frames"][0]["extra_ms_per_step"] == 40.0, why["frames"]
    assert why["cause"] == "compute", why
    assert "straggle (faults.py:188)" in why["text"]


def test_samples_alone_do_not_make_compute_where_the_breakdown_shows_no_extra_work():
    """The samples say where a rank's time goes, the breakdown whether it has more of it:
    a rank whose own work is no longer than its peer's is not late by its work, whatever
    line its samples fall on."""
    slow = rank_steps(20, 150.0, 78.0, [SLEEP, SLEEP, FORWARD])
    peer = rank_steps(20, 150.0, 80.0, [FORWARD, FORWARD, FORWARD])
    keys = list(slow.steps)
    why = cause.explain(2, 40.0, keys, {2: slow, 3: peer}, {3: keys}, {"4": 1.0}, {"4"})
    assert why["cause"] != "compute", why
