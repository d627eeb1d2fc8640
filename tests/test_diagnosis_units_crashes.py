"""The crash rules on hand-built event streams (eventstreams.py): a rank that dies of a
peer's crash, or vanishes after its collective failed, is a consequence; the launcher's
word on a stopped rank beats a guess; the output's traceback keeps the ops' step."""

from __future__ import annotations

from eventstreams import Stream, engine_with

from distdoctor.diagnosis.crashes.crash import ExitInfo
from distdoctor.diagnosis.engine.core import Engine
from distdoctor.findings import Finding


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
