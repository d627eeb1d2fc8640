"""Why a straggler is late (cause.py) on the shape a loaded 2-core CI machine recorded:
the DP x PP trainer's stage rank sleeping 40 ms a step, whose per-step lateness summed to
66 ms (its upstream stage's p2p waits and its DP peer's, one delay counted twice) while
its breakdown against its DP peer showed 30 ms of extra own work and its samples 40 ms at
the sleeping line. The summary named that line as where its time went, and details said
"unknown". Real RankSteps fed step by step, as the engine feeds them."""

from __future__ import annotations

from types import SimpleNamespace as NS

from distdoctor.diagnosis.stragglers import cause
from distdoctor.diagnosis.stragglers.steptime import RankSteps

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


PURE_PYTHON = {"function": "extra_diagnostics", "file": "/x/train.py", "line": 77}


def test_own_work_on_a_busy_machine_is_the_programs_not_the_cpus():
    """Issue 48, program before machine: a rank doing ~30 ms of pure-Python work of its own
    per step on a node where other processes keep every core busy. It is runnable longer,
    so it also waits longer for a CPU (its run queue delay, from the samples' numel_in in
    us); the line its peers never run still makes it the program's straggler."""
    slow = rank_steps(20, 300.0, 60.0, [PURE_PYTHON, PURE_PYTHON, FORWARD, FORWARD])
    peer = rank_steps(20, 300.0, 100.0, [FORWARD, FORWARD])
    for ev_rank, runq_us in ((slow, 30_000), (peer, 8_000)):  # its wait per sample
        for st in ev_rank.steps.values():
            st.runq_ms += runq_us / 1000 * 4
    keys = list(slow.steps)
    why = cause.explain(1, 40.0, keys, {1: slow, 2: peer}, {2: keys}, {"4": 1.0}, {"4"})
    b = why["breakdown"]
    cpu_extra = b["1"]["runq_ms"] - b["2"]["runq_ms"]
    compute_extra = b["1"]["compute_ms"] - b["2"]["compute_ms"]
    assert cpu_extra >= 2 * (compute_extra - cpu_extra), b  # what read as the machine's
    assert why["cause"] == "compute", why
    assert why["own_work_ms_per_step"] == 40.0 and "extra_diagnostics" in why["text"]


def test_a_rank_with_its_own_work_stays_a_straggler_beside_busy_processes():
    """host_noise.separate keeps a straggler whose extra work is at lines of its own on a
    busy node (the busy processes noted); the same rank with no such line is the host's."""
    from distdoctor.diagnosis.stragglers.host_noise import separate
    from distdoctor.findings import Finding

    procs = (NS(rank=0, runq_ms_per_s=900.0), NS(rank=1, runq_ms_per_s=300.0))
    stats = NS(steal_pct=0.0, others_pct=150.0,
               busy=({"pid": 9, "pids": [9], "name": "spin", "cpu_pct": 150.0},))
    samples = [NS(host="n0", processes=procs, host_stats=stats) for _ in range(5)]
    time = {r: NS(recent=lambda: {"wall_ms": 300.0}) for r in (0, 1)}

    def straggler(**extra):
        return Finding("straggler", "warning", "s", [0], "0", None, [], details={
            "step_lateness_ms": 40.0, "steps": 60, "cause": "cpu", "top_frames": [],
            "breakdown": {"0": {"compute_ms": 200.0, "runq_ms": 150.0},
                          "1": {"compute_ms": 150.0, "runq_ms": 60.0}}, **extra})

    assert [f.kind for f in separate([straggler()], samples, time)] == ["host"]
    kept = separate([straggler(own_work_ms_per_step=40.0)], samples, time)
    assert [f.kind for f in kept] == ["straggler"], kept
    assert kept[0].details["busy_processes"][0]["name"] == "spin"
