"""Detectors on hand-built event streams: the rules, case by case, without processes."""

from __future__ import annotations

import json

import pytest

from distdoctor.diagnosis.crashes.crash import ExitInfo
from distdoctor.diagnosis.engine.core import Engine
from distdoctor.findings import Finding, write_findings
from distdoctor.runlog.reader import Event

S = 1_000_000_000  # ns per second


class Stream:
    """Builds one rank's events in order, with its own clock."""

    def __init__(self, rank: int):
        self.rank, self.index = rank, 0

    def op(self, op="all_reduce", group="0", ranks=(0, 1, 2, 3), seq=0, numel=8,
           dtype="float32", t=0.0, wait=0.001, done=True, peer=None, kind="collective",
           line=10, span=0, status=None, error=None):
        ev = Event(rank=self.rank, index=self.index, kind=kind, op=op,
                   status=status or ("ok" if done else "in_flight"), group=group,
                   group_desc="", group_ranks=tuple(ranks), seq=seq, peer=peer,
                   shapes=((numel,),), dtypes=(dtype,), device="cpu", numel_in=numel,
                   numel_out=numel, reduce_op="sum" if "reduce" in op else None,
                   callsite={"file": "/job/train.py", "line": line, "function": "step"},
                   t_enter_ns=int(t * S), t_end_ns=int((t + wait) * S) if done else None,
                   span_index=span, name=None, error=error, is_async=False,
                   other_thread=False)
        self.index += 1
        return ev

    def span(self, name, t=0.0):
        ev = Event(rank=self.rank, index=self.index, kind="span", op="span", status="ok",
                   group="", group_desc="", group_ranks=(), seq=0, peer=None, shapes=(),
                   dtypes=(), device="", numel_in=0, numel_out=0, reduce_op=None,
                   callsite=None, t_enter_ns=int(t * S), t_end_ns=None, span_index=0,
                   name=name, error=None, is_async=None, other_thread=False)
        self.index += 1
        return ev


def engine_with(events, timeout=5.0, now=None, heartbeats=None, exits=None):
    e = Engine(timeout)
    e.ingest(events, 0.0)
    for rank, hb in (heartbeats or {}).items():
        e.heartbeat(rank, int(hb * S), 0.0)
    for rank, info in (exits or {}).items():
        e.exited(rank, info)
    e.tick(now, final=True)
    return e.findings()


def test_odd_one_out_is_the_culprit_and_a_tie_is_broken_by_the_groups_history():
    ranks = [Stream(r) for r in range(4)]
    evs = [s.op(seq=0) for s in ranks]
    evs += [s.op(seq=1, numel=9 if s.rank == 2 else 8, t=1) for s in ranks]
    (f,) = engine_with(evs)
    assert (f.kind, f.ranks, f.seq) == ("mismatch", [2], 1)
    assert f.details["differs_in"] == ["numel"]
    # two ranks, two variants: the one that breaks the group's habit (a new line) is odd
    a, b = Stream(0), Stream(1)
    evs = [a.op(ranks=(0, 1)), b.op(ranks=(0, 1)),
           a.op(ranks=(0, 1), seq=1, t=1), b.op("broadcast", ranks=(0, 1), seq=1, t=1, line=99)]
    (f,) = engine_with(evs)
    assert f.ranks == [1] and f.callsites[0]["line"] == 99


def test_uneven_all_to_all_and_a_gathers_root_are_not_mismatches():
    ranks = [Stream(r) for r in range(3)]
    evs = [s.op("all_to_all_single", ranks=(0, 1, 2), numel=4 + s.rank) for s in ranks]
    assert engine_with(evs) == []


def test_hang_names_the_rank_that_never_joined_and_where_it_is():
    ranks = [Stream(r) for r in range(4)]
    evs = [s.op(seq=0) for s in ranks]
    evs += [s.op(seq=1, t=1, done=False) for s in ranks if s.rank != 3]
    findings = engine_with(evs, heartbeats={r: 20 for r in range(4)})
    (f,) = findings
    assert (f.kind, f.ranks) == ("hang", [3])
    assert "in no collective" in f.summary and f.details["waiting_ranks"] == [0, 1, 2]
    # below the timeout: nothing yet
    assert engine_with(evs, heartbeats={r: 3 for r in range(4)}) == []


def test_recv_against_recv_is_a_deadlock_and_a_crash_is_not_a_hang():
    a, b = Stream(0), Stream(1)
    evs = [a.op("recv", kind="p2p", ranks=(0, 1), peer=1, done=False),
           b.op("recv", kind="p2p", ranks=(0, 1), peer=0, done=False)]
    (f,) = engine_with(evs, heartbeats={0: 30, 1: 30})
    assert (f.kind, f.ranks) == ("deadlock", [0, 1])
    ranks = [Stream(r) for r in range(3)]
    evs = [s.op(ranks=(0, 1, 2), done=s.rank != 2) for s in ranks]
    evs += [s.op(ranks=(0, 1, 2), seq=1, t=1, done=False) for s in ranks[:2]]
    findings = engine_with(evs, heartbeats={r: 30 for r in range(3)},
                           exits={2: ExitInfo(-9)})
    assert [(f.kind, f.ranks) for f in findings] == [("crash", [2])]
    assert "SIGKILL" in findings[0].summary and findings[0].details["waiting_ranks"] == [0, 1]


def test_a_hang_blamed_on_a_rank_that_then_dies_of_a_peers_crash_is_dropped():
    # rank 1 is SIGKILLed; rank 0's collective with it fails and rank 0 exits; rank 2's
    # collective with rank 0 then fails with rank 0 missing. While rank 0's exit status is
    # unknown that looks like rank 0 hung; once its exit code arrives, it is a consequence.
    r0, r1, r2 = Stream(0), Stream(1), Stream(2)
    evs = [r1.op(ranks=(0, 1), group="3", done=False),
           r0.op(ranks=(0, 1), group="3", wait=0.5,
                 status="error", error="Connection reset by peer"),
           r2.op(ranks=(0, 2), group="1", wait=0.5, status="error",
                 error="Connection closed by peer")]
    e = Engine(5.0)
    e.ingest(evs, 0.0)
    e.exited(1, ExitInfo(-9))
    e.exited(0, ExitInfo(None, "closed"))
    e.exited(2, ExitInfo(1))
    e.tick(None, final=True)
    assert any(f.kind == "hang" and f.ranks == [0] for f in e.findings())
    e.exited(0, ExitInfo(1))
    e.tick(None, final=True)
    errors = [(f.kind, f.ranks) for f in e.findings() if f.severity == "error"]
    assert errors == [("crash", [1])]


def test_a_rank_that_vanishes_after_its_collective_failed_is_a_consequence():
    # under a wrapped torchrun no exit codes arrive: rank 2 is SIGKILLed, rank 1's
    # all_reduce with it fails, then torchrun tears rank 1 down; both merely vanish
    r1, r2 = Stream(1), Stream(2)
    evs = [r2.op(ranks=(1, 2), done=False),
           r1.op(ranks=(1, 2), wait=0.2, status="error", error="Connection closed by peer")]
    findings = engine_with(evs, exits={1: ExitInfo(None, "vanished"),
                                       2: ExitInfo(None, "vanished")})
    crashes = {f.ranks[0]: f.severity for f in findings if f.kind == "crash"}
    assert crashes == {1: "warning", 2: "error"}


def test_the_culprits_stuck_line_from_its_stack_survives_it_being_stopped():
    ranks = [Stream(r) for r in range(3)]
    evs = [s.op(ranks=(0, 1, 2)) for s in ranks]
    evs += [s.op(ranks=(0, 1, 2), seq=1, t=1, done=False) for s in ranks[:2]]
    stack = ('Thread 7 (idle): "MainThread"\n'
             '    hang_in_compute (job/faults.py:199)\n    train (job/train.py:9)\n')
    taken = []
    e = Engine(5.0, stacks=lambda rs: taken.append(rs) or {r: stack for r in rs})
    e.ingest(evs, 0.0)
    for r in range(3):
        e.heartbeat(r, 30 * S, 0.0)
    e.tick(None)
    e.exited(2, ExitInfo(None, "stopped"))  # --on-hang kill: the summary changes
    e.tick(None, final=True)
    (f,) = e.findings()
    assert (f.kind, f.ranks, taken) == ("hang", [2], [[2]])  # stacks taken once
    assert f.callsites[0]["file"] == "job/faults.py" and f.callsites[0]["line"] == 199
    assert "stopped by distdoctor" in f.summary and "stack is at job/faults.py" in f.summary


def _steps(n_ranks, steps, late_rank=None, late_ms=0.0, cohort=(), first_step_ms=0.0):
    """Each step: 10 world collectives; `late_rank` arrives `late_ms` late at the first;
    a `cohort` of ranks arrives 300 ms late together at the last (as a pipeline stage);
    in the first step the others connect `first_step_ms` late (lazy connection set-up)."""
    streams = [Stream(r) for r in range(n_ranks)]
    evs, seq, t = [], 0, 0.0
    ranks = tuple(range(n_ranks))
    for step in range(steps):
        open_span = {}
        for s in streams:
            ev = s.span(f"step {step}", t)
            open_span[s.rank] = ev.index + 1  # what the tracer stamps on ops inside it
            evs.append(ev)
        for k in range(10):
            delay = {r: 0.0 for r in ranks}
            if k == 0 and late_rank is not None:
                delay[late_rank] = late_ms / 1000
                if step == 0:
                    delay = {r: first_step_ms / 1000 for r in ranks if r != late_rank}
                    delay[late_rank] = 0.0
            if k == 9:
                for r in cohort:
                    delay[r] = 0.3
            arrive_last = max(delay.values())
            for s in streams:
                enter = t + delay[s.rank] + 0.0001 * ((s.rank * 7 + k) % 5)  # jitter
                evs.append(s.op(ranks=ranks, seq=seq, t=enter,
                                wait=t + arrive_last + 0.001 - enter,
                                span=open_span[s.rank]))
            seq += 1
            t += 0.5
    return evs


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


def test_findings_json_round_trips(tmp_path):
    f = Finding("hang", "error", "x", [3], "0", 4, [{"rank": 3, "file": "a.py", "line": 1,
                                                     "function": "f"}], {"3": "stack"},
                {"waited_s": 5.0}, "fix it")
    write_findings(tmp_path, [f])
    data = json.loads((tmp_path / "findings.json").read_text())
    assert set(data["findings"][0]) == {"kind", "severity", "summary", "ranks", "group",
                                        "seq", "callsites", "stacks", "details", "remedy"}
    assert Finding.from_json(data["findings"][0]) == f
    with pytest.raises(ValueError):
        Finding("nonsense", "error", "x")


def test_a_rank_guessed_dead_that_the_launcher_says_it_stopped_is_no_crash():
    # run stops the other ranks after one fails; the live engine may see a stopped rank's
    # pid gone before the launcher's exit code arrives: that guess gives way to the exit
    r0, r1 = Stream(0), Stream(1)
    evs = [r0.op(ranks=(0, 1), done=False), r1.op(ranks=(0, 1))]
    e = Engine(5.0)
    e.ingest(evs, 0.0)
    e.exited(1, ExitInfo(None, "vanished"))
    e.tick(None, final=True)
    assert any(f.kind == "crash" and f.ranks == [1] for f in e.findings())
    e.exited(1, ExitInfo(-15, "stopped"))
    e.tick(None, final=True)
    assert not any(f.kind == "crash" and f.ranks == [1] for f in e.findings())


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


def test_a_crash_the_log_explains_keeps_the_step_the_ops_said():
    """The job's output has rank 1's traceback, the log of ops its step: the log's finding
    replaces the exit-code crash and says the step that crash knew; a second merge (the
    live engine merges at every tick) does not say it twice."""
    from distdoctor.diagnosis.crashes.crash import merge_crashes

    exit_crash = Finding("crash", "error", "crash: rank 1 exited with code 1, in step 5",
                         [1], details={"how": "exit", "exit_code": 1, "span": "step 5"})
    traceback = Finding("crash", "error", "rank 1 raised ValueError: no batch at data.py:3",
                        [1], details={"source": "log", "family": "exception"})
    once = merge_crashes([exit_crash, traceback], {0, 1})
    assert once == [traceback] and traceback.details["span"] == "step 5"
    assert traceback.summary.endswith("; rank 1 was in step 5")
    twice = merge_crashes([exit_crash, traceback], {0, 1})
    assert twice[0].summary.count("step 5") == 1


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


def test_a_batch_is_ops_posted_before_the_one_before_completed_not_a_quick_blocking_recv():
    """same_batch: batch_isend_irecv posts each op before the one before it completes; a
    blocking recv that found its message waiting, then the next recv a moment later (r23
    on a loaded machine: 1 ms apart), is two steps, not one batch."""
    from types import SimpleNamespace

    from distdoctor.diagnosis.hangs.waits import same_batch

    s = Stream(3)
    first = s.op("recv", kind="p2p", peer=2, t=1.0, wait=0.0002)  # done at 1.0002
    blocking = s.op("recv", kind="p2p", peer=2, t=1.001, done=False)
    assert not same_batch(SimpleNamespace(last_done=first), blocking)
    s = Stream(3)
    first = s.op("recv", kind="p2p", peer=2, t=1.0, wait=0.004)  # still pending at 1.001
    batched = s.op("recv", kind="p2p", peer=2, t=1.001, done=False)
    assert same_batch(SimpleNamespace(last_done=first), batched)


def _two_threads_in_flight(rank: int) -> list:
    """A rank whose metrics thread and main thread each have an all_reduce in flight on the
    default group, numbered in the same order on every rank (h17's first ops)."""
    s = Stream(rank)
    metric = s.op(seq=0, ranks=(0, 1), numel=1, line=14, done=False)
    metric.callsite.update(thread="Thread-1 (reporter)", thread_id=140 + rank, function="reporter")
    grads = s.op(seq=1, ranks=(0, 1), numel=256, line=27, done=False, t=0.001)
    return [metric, grads]


@pytest.mark.parametrize("code, raced", [(-6, True), (-9, False)])
def test_ranks_that_die_with_two_threads_ops_in_flight_died_of_that_race(code, raced):
    """The traced order agrees on both ranks, so no traced mismatch shows the race; a
    rank killed from outside (SIGKILL) died of that, not of the race."""
    found = engine_with(_two_threads_in_flight(0) + _two_threads_in_flight(1),
                        exits={0: ExitInfo(code), 1: ExitInfo(code)})
    errors = [f for f in found if f.severity == "error"]
    if not raced:
        assert all(f.kind == "crash" for f in errors), [f.summary for f in found]
        return
    (top,) = errors
    assert (top.kind, top.ranks, top.details["reason"]) == ("mismatch", [0, 1],
                                                             "threads_share_group")
    assert "Thread-1 (reporter)" in top.summary and "in flight at once" in top.summary
    assert {f.severity for f in found if f.kind == "crash"} == {"warning"}


def test_a_rank_that_raised_between_collectives_is_the_cause_not_the_others_threads():
    """Rank 1 raised in its own code (its last op went well); rank 0's two threads' ops
    failed when it left: rank 1's exception, not a race."""
    s = Stream(1)
    done = s.op(seq=0, ranks=(0, 1), numel=1, line=14)
    found = engine_with(_two_threads_in_flight(0) + [done],
                        exits={0: ExitInfo(1), 1: ExitInfo(1)})
    assert not [f for f in found if f.kind == "mismatch"], [f.summary for f in found]


def _checkpoint_beside_barrier(rank: int) -> list:
    """r31's shape: the main thread's barrier and an async-save executor's all_gather (a
    torch thread: no user frame of its own, so the main thread's line) on the default
    group, numbered alike on both ranks, both timed out."""
    s = Stream(rank)
    barrier = s.op(op="barrier", seq=30, ranks=(0, 1), line=470, status="timeout")
    gather = s.op(op="all_gather", seq=31, ranks=(0, 1), line=470, status="timeout", t=0.001)
    gather.other_thread = True
    return [barrier, gather]


def test_a_torch_thread_beside_the_main_thread_in_flight_at_failure_is_the_race():
    """Both ranks' ops failed (timed out), then distdoctor stopped them: the race."""
    found = engine_with(_checkpoint_beside_barrier(0) + _checkpoint_beside_barrier(1),
                        exits={0: ExitInfo(-15, "stopped"), 1: ExitInfo(-15, "stopped")})
    (top,) = [f for f in found if f.severity == "error"]
    assert top.details["reason"] == "threads_share_group" and top.ranks == [0, 1]
    assert "a thread of torch's beside the main thread" in top.summary
