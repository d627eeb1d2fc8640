"""Detectors on hand-built event streams: the rules, case by case, without processes.
Here mismatches, hangs, deadlocks, two threads' race on one group and the findings' JSON;
crashes in test_diagnosis_units_crashes.py, stragglers in test_diagnosis_units_stragglers.py
(the streams: eventstreams.py)."""

from __future__ import annotations

import json

import pytest
from eventstreams import S, Stream, engine_with

from distdoctor.diagnosis.crashes.crash import ExitInfo
from distdoctor.diagnosis.engine.core import Engine
from distdoctor.findings import Finding, write_findings


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
