"""The straggler rules on hand-built steps (eventstreams.py's _steps): a late rank found and
a late cohort not; warm-up, short rises, ended stretches and occasional late steps left
out; where the onset is; a rank slowed by its host's other processes is the host's."""

from __future__ import annotations

import pytest
from eventstreams import _steps, engine_with

from distdoctor.findings import Finding


def test_straggler_found_and_a_late_cohort_is_not_one():
    findings = engine_with(_steps(4, 20, late_rank=2, late_ms=30))
    assert [(f.kind, f.ranks) for f in findings] == [("straggler", [2])]
    assert findings[0].details["step_lateness_ms"] == pytest.approx(30, rel=0.2)
    assert engine_with(_steps(8, 20, cohort=(0, 1, 2, 3))) == []
    assert engine_with(_steps(4, 20)) == []


def test_the_first_step_is_warm_up_and_not_scored():
    # seen in CI: a rank 150 ms late at every step waited 1.3 s in step 1 while the
    # others set up their connections; that one sum sank its t-statistic below 4
    findings = engine_with(_steps(4, 20, late_rank=1, late_ms=150, first_step_ms=1300))
    assert [(f.kind, f.ranks) for f in findings] == [("straggler", [1])]
    assert findings[0].details["steps"] == 18  # 20, less the warm-up and the open one


def test_a_short_rise_waits_to_be_judged():
    """A rank late by the floor in its last few steps only (a healthy job's last 5 steps,
    5 ms late each, on a 2-core VM) is not yet a straggler: a rise is judged once it has
    lasted MIN_RISE_STEPS; a rank late in most of its steps is judged at once."""
    from distdoctor.diagnosis.stragglers.stepstats import onset, t
    from distdoctor.diagnosis.stragglers.straggler import StragglerTracker

    def score(xs):
        split, rise, t_rise = onset(xs)
        return {"step_lateness_ms": sum(xs) / len(xs), "t": t(xs), "series": xs,
                "keys": list(range(len(xs))), "history": list(enumerate(xs)),
                "onset": 0, "onset_split": split, "rise_ms": rise, "onset_t": t_rise}

    tracker = StragglerTracker()
    noise = [(-1.0) ** i * 0.5 for i in range(40)]
    assert not tracker.is_straggler(score(noise + [12.0, 12.5, 11.5, 12.0, 12.2]))
    assert tracker.is_straggler(score(noise + [12.0, 12.5, 11.5, 12.0, 12.2] * 2))
    assert tracker.is_straggler(score([12.0, 12.5, 11.5, 12.0, 12.2] * 4))  # late throughout


def test_the_onset_is_where_the_rise_explains_most_not_where_t_peaks():
    """A rank late by 25 ms from step 40, whose first late step was cut short by the
    scheduler (a noisy step early in the rise): the rise starts at 40. The best Welch t
    would split after the noisy step, where the later side is quietest."""
    from distdoctor.diagnosis.stragglers.stepstats import onset

    xs = [0.4, -0.3] * 20 + [25.0, 9.0, 24.0, 26.0] + [25.0, 24.5, 25.5] * 5
    split, rise, t_rise = onset(xs)
    assert split == 40 and rise > 20 and t_rise > 5


def test_an_onset_the_window_slid_past_is_found_in_the_history():
    """A rank late in every step of its window, whose first verdict came after the
    window had slid past its onset: the finding says since the step where its longer
    history rose, not since the window's first step."""
    from distdoctor.diagnosis.stragglers.straggler import StragglerTracker

    history = [(k, 0.3 if k % 2 else -0.3) for k in range(40)] + \
              [(k, 25.0 + (k % 3) - 1) for k in range(40, 120)]
    window = history[-60:]
    s = {"history": history, "keys": [k for k, _ in window]}
    assert StragglerTracker()._onset_before_window(s) == 40
    steady = [(k, 25.0 + (k % 3) - 1) for k in range(120)]  # late from its first step
    assert StragglerTracker()._onset_before_window(
        {"history": steady, "keys": [k for k, _ in steady[-60:]]}) is None


def test_occasional_late_steps_are_left_out_and_a_rise_is_kept():
    """nanoGPT's rank 0 evaluates every N steps: those steps, far above its typical one,
    alone or two in a row and few, are left out of the verdict (stepstats.typical); a
    rank late since some step is late in a run of steps, which stays."""
    from distdoctor.diagnosis.stragglers.stepstats import typical

    steps = list(enumerate(([3.0] * 9 + [300.0]) * 6))
    kept = typical(steps, 5.0)
    assert len(kept) == 54 and max(x for _, x in kept) == 3.0
    rise = list(enumerate([0.0] * 50 + [25.0] * 10))
    assert typical(rise, 5.0) == rise
    often = list(enumerate([0.0, 0.0, 300.0] * 20))  # a third of the steps: its normal
    assert typical(often, 5.0) == often


def test_a_rank_late_for_its_cpu_or_at_no_line_beside_busy_processes_is_the_hosts():
    """host_noise.separate: on a node where other processes use a core and a half, a rank
    whose main thread waited for a CPU (cause cpu) is the host's, though the node
    sampler's whole-process reading saw both ranks wait alike; so is one whose extra
    work sits at no line it runs twice as long as its peers. Work at a line of its own
    stays the program's; on a quiet node, no line says nothing of the machine."""
    from types import SimpleNamespace as NS

    from distdoctor.diagnosis.stragglers.host_noise import separate

    def samples(others_pct):
        procs = (NS(rank=0, runq_ms_per_s=900.0), NS(rank=1, runq_ms_per_s=900.0))
        stats = NS(steal_pct=0.0, others_pct=others_pct,
                   busy=({"pid": 9, "pids": [9], "name": "spin", "cpu_pct": others_pct},))
        return [NS(host="n0", processes=procs, host_stats=stats) for _ in range(5)]

    def straggler(cause, frames=()):
        breakdown = {"1": {"compute_ms": 40.0, "runq_ms": 28.0},
                     "0": {"compute_ms": 27.0, "runq_ms": 17.0}}
        return Finding("straggler", "warning", "s", [1], "0", None, [], details={
            "step_lateness_ms": 13.0, "steps": 60, "cause": cause, "breakdown": breakdown,
            "top_frames": list(frames)})

    time = {r: NS(recent=lambda: {"wall_ms": 100.0}) for r in (0, 1)}
    busy, quiet = samples(150.0), samples(2.0)
    own = {"extra_ms_per_step": 13.0, "peers_ms_per_step": 0.0}
    shared = {"extra_ms_per_step": 13.0, "peers_ms_per_step": 40.0}  # the backward pass
    for f, kind in [(straggler("cpu"), "host"), (straggler("compute"), "host"),
                    (straggler("compute", [shared]), "host"),
                    (straggler("compute", [own]), "straggler")]:
        out = separate([f], busy, time)
        assert [x.kind for x in out] == [kind], (f.details, out)
        if kind == "host":
            assert out[0].details["slowed_ranks"] == [1]
    assert [x.kind for x in separate([straggler("compute")], quiet, time)] == ["straggler"]


def test_a_late_stretch_that_has_ended_is_no_straggler():
    """A healthy 2-rank FSDP2 job on 2 cores (recorded in a CI-like run): rank 1 late by
    15 ms per step for 9 steps, then on time, judged at its 13th step. A straggler keeps
    the others waiting now; the same stretch still going on is one."""
    from distdoctor.diagnosis.stragglers.stepstats import onset, t
    from distdoctor.diagnosis.stragglers.straggler import StragglerTracker

    def score(xs):
        split, rise, t_rise = onset(xs)
        return {"step_lateness_ms": sum(xs) / len(xs), "t": t(xs), "series": xs,
                "keys": list(range(len(xs))), "history": list(enumerate(xs)),
                "onset": 0, "onset_split": split, "rise_ms": rise, "onset_t": t_rise}

    ended = [1.89, 8.0, 12.72, 16.67, 15.58, 14.26, 19.44, 16.54, 16.54, 13.92, 4.9, 3.56,
             -0.93]
    assert not StragglerTracker().is_straggler(score(ended))
    going_on = ended[:10] + [14.9, 13.6, 15.1]
    assert StragglerTracker().is_straggler(score(going_on))


def test_the_lateness_window_and_its_history_are_the_newest_finished_steps():
    """Steps closes its oldest steps into arrays a window at a time (stepstats.py): what it
    reads is still the newest STEPS finished steps and the newest LONG_STEPS, in the order
    first seen, the warm-up left out; a late addition inside the window counts there."""
    from distdoctor.diagnosis.stragglers.stepstats import LONG_STEPS, STEPS, Steps

    steps, sums = Steps(), {}
    for key in range(2000):
        for k in (key, key - 30):  # each step, and a late addition to one 30 steps back
            if k < 0:
                continue
            steps.add(k, k / 7)
            if k > 0:  # (step 0 is the warm-up)
                sums[k] = sums.get(k, 0.0) + k / 7
        finished = list(sums.items())[:-1]
        assert steps.sums == finished[-STEPS:]
        if key % 97 == 0 or key > 1990:
            assert steps.long_sums == finished[-LONG_STEPS:]
    assert len(steps.old_keys) <= 2 * (LONG_STEPS - STEPS)  # bounded
