"""The log families live, under `distdoctor run`: a failure every rank shares is one finding,
and an exception on one rank is that exception (with its line), whether or not the rank has
exited when the others are found waiting."""

from __future__ import annotations

import json

import pytest

from tests.conftest import JOBS, marker_lines, run_cli, run_job


def _findings(run_dir):
    return json.loads((run_dir / "findings.json").read_text())["findings"]


@pytest.mark.timeout(150)
def test_a_start_up_failure_on_every_rank_is_one_finding(tmp_path):
    run_dir = tmp_path / "run"
    res = run_job("live_logs/startup_usage.py", 3, run_dir, timeout=120)
    assert res.returncode != 0
    errors = [f for f in _findings(run_dir) if f["severity"] == "error"]
    assert len(errors) == 1, errors
    (f,) = errors
    assert f["kind"] == "crash" and f["ranks"] == [0, 1, 2]
    assert "every rank" in f["summary"] and "--data-dir" in f["summary"], f["summary"]


@pytest.mark.timeout(150)
def test_an_exception_on_one_rank_is_named_with_its_line_not_a_hang(tmp_path):
    run_dir = tmp_path / "run"
    res = run_job("live_logs/ddp_raise.py", 3, run_dir, timeout=120)
    assert res.returncode != 0
    found = _findings(run_dir)
    errors = [f for f in found if f["severity"] == "error"]
    assert errors, found
    top = errors[0]
    assert top["kind"] == "crash" and top["ranks"] == [1], top
    assert "ValueError" in top["summary"] and "bad batch at step 3" in top["summary"]
    line = marker_lines("live_logs/ddp_raise.py")["raise"]
    assert any(c.get("line") == line and c["file"].endswith("ddp_raise.py")
               for c in top["callsites"]), top["callsites"]
    assert not [f for f in errors if f["kind"] == "hang" and 1 in f["ranks"]], errors


@pytest.mark.timeout(150)
def test_a_threads_uncaught_exception_in_a_healthy_job_is_no_crash_of_its_rank(tmp_path):
    """Every rank's metrics thread dies of an exception and the job trains on and exits 0:
    "every rank failed at start-up with ValueError" (an error) before; now a warning that
    names the thread and its line."""
    run_dir = tmp_path / "run"
    res = run_job("live_logs/thread_raises.py", 2, run_dir, "healthy", timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    found = _findings(run_dir)
    assert not [f for f in found if f["severity"] == "error"], found
    (f,) = [f for f in found if f["kind"] == "crash"]
    assert f["severity"] == "warning" and f["ranks"] == [0, 1], f
    assert "a thread ('worker')" in f["summary"] and "ValueError" in f["summary"], f
    line = marker_lines("live_logs/thread_raises.py")["metrics"]
    assert {c["line"] for c in f["callsites"]} == {line}, f["callsites"]


@pytest.mark.timeout(150)
def test_a_rank_that_died_after_its_thread_did_says_the_thread_first(tmp_path):
    """Rank 1's prefetch thread dies; its main thread gives up on the queue and the rank
    exits 1. The rank's crash (its own exception, as the tracer saw it) says the thread's
    death before it: the log's finding of it was dropped as a second crash of the rank."""
    run_dir = tmp_path / "run"
    res = run_job("live_logs/thread_raises.py", 2, run_dir, "prefetch", timeout=120)
    assert res.returncode != 0
    errors = [f for f in _findings(run_dir) if f["severity"] == "error"]
    assert errors and errors[0]["kind"] == "crash" and errors[0]["ranks"] == [1], errors
    top = errors[0]
    said = "before it, a thread ('worker') of rank 1 died of OSError"
    assert top["summary"].count(said) == 1, top
    line = marker_lines("live_logs/thread_raises.py")["prefetch"]
    assert any(c.get("line") == line for c in top["callsites"]), top["callsites"]


@pytest.mark.timeout(150)
def test_an_exception_the_rank_logged_and_lived_past_is_no_crash(tmp_path):
    """Rank 0 logs a handled exception with its traceback and every rank exits 0: its
    "CRASH rank 0 raised RuntimeError" stayed an error in findings.json; now a warning
    that says the process went on (it is printed as the job runs, when its end is not
    known yet)."""
    run_dir = tmp_path / "run"
    res = run_job("live_logs/handled_exception.py", 2, run_dir, timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    found = _findings(run_dir)
    assert not [f for f in found if f["severity"] == "error"], found
    (f,) = [f for f in found if f["kind"] == "crash"]
    assert f["severity"] == "warning" and f["ranks"] == [0], f
    assert "RuntimeError" in f["summary"] and "exited normally" in f["summary"], f


@pytest.mark.timeout(150)
def test_an_exception_a_running_rank_logged_is_not_said_live_as_its_crash(tmp_path):
    """Printed as the job ran: "CRASH rank 0 raised RuntimeError", while rank 0 trained
    on for seconds. Now the exception a running rank prints waits for its end (an
    uncaught one ends it within moments); still running 5 s later, it is said as a
    warning, and its end settles it."""
    run_dir = tmp_path / "run"
    res = run_job("live_logs/handled_exception.py", 2, run_dir, "9", timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    said = [line for line in res.stderr.splitlines() if "RuntimeError" in line]
    assert said and not [line for line in said if "CRASH" in line], res.stderr[-3000:]
    assert "went on" in " ".join(res.stderr.split()), res.stderr[-3000:]
    (f,) = [f for f in _findings(run_dir) if f["kind"] == "crash"]
    assert f["severity"] == "warning" and "exited normally" in f["summary"], f


@pytest.mark.timeout(150)
def test_an_exception_whose_rank_was_stopped_stuck_stays_its_crash(tmp_path):
    """Rank 1 printed its exception and called sys.exit(1); a thread kept it alive, stuck,
    until --on-hang kill stopped it. Still running 5 s after the print, it was said as a
    warning ("so far"), and its end, being stopped, settled it as "went on and exited
    normally: not what ended it". A stopped rank did not exit normally: the exception
    stays its crash, as it was before the wait."""
    run_dir = tmp_path / "run"
    res = run_cli(["run", "--nproc", "2", "--run-dir", str(run_dir), "--grace", "2",
                   "--hang-timeout", "8", "--on-hang", "kill", "--",
                   str(JOBS / "live_logs/exception_then_stuck.py"), "90"],
                  timeout=120, run_dir=run_dir)
    assert "stopping the job" in res.stderr, res.stderr[-3000:]
    (f,) = [f for f in _findings(run_dir) if "loss is nan" in f["summary"]]
    assert f["kind"] == "crash" and f["severity"] == "error" and f["ranks"] == [1], f
    assert "exited normally" not in f["summary"] and "went_on" not in f["details"], f


@pytest.mark.timeout(150)
def test_an_exception_whose_rank_is_slow_to_end_is_not_said_handled(tmp_path):
    """Rank 1 printed its exception and called sys.exit(1); a thread held it up 8 s more.
    Still running 5 s after the print, it was said live as "an exception it handled, not
    its end": it was its end. Said now as what is known: it went on so far."""
    run_dir = tmp_path / "run"
    res = run_job("live_logs/exception_then_stuck.py", 2, run_dir, "8", timeout=120)
    text = " ".join(res.stderr.split())  # (the live line, as wrapped, up to the next one)
    said = text.partition("distdoctor: EXCEPTION")[2].partition("distdoctor:")[0]
    assert "loss is nan" in said and "went on" in said, res.stderr[-3000:]
    assert "not its end" not in said, said
    found = _findings(run_dir)  # (its end: the crash, the exception folded in it)
    assert [f for f in found if f["kind"] == "crash" and f["ranks"] == [1]
            and f["severity"] == "error"], found
    assert not [f for f in found if f["details"].get("went_on")], found


def test_a_dead_threads_fold_is_the_same_at_every_look():
    """The engine merges its crashes again each time its findings are read (every pass
    that writes findings.json, every view): the fold made a new finding, or the rank's
    own grew a "before it" each time."""
    from distdoctor.diagnosis.crashes.crash import merge_crashes
    from distdoctor.findings import Finding

    rank = Finding("crash", "error", "crash: rank 1 raised Empty", [1],
                   details={"exception": {"type": "Empty"}})
    thread = Finding("crash", "error", "a thread ('w') of rank 1 died of OSError", [1],
                     details={"source": "log", "thread": "w"})
    looks = [[f.summary for f in merge_crashes([rank, thread], {0, 1})] for _ in range(3)]
    assert looks == [["crash: rank 1 raised Empty; before it, a thread ('w') of rank 1 "
                      "died of OSError"]] * 3, looks
    assert rank.summary == "crash: rank 1 raised Empty"


def test_a_held_exception_never_takes_the_place_of_its_newer_version():
    """Rank 0 printed an exception and ran on (held); rank 1 then died of the same, and
    the update naming both ranks was said at once. 5 s on, the held older version (rank
    0 alone) took its place: in the end rank 1's crash lost the exception it died of."""
    from distdoctor.diagnosis.crashes.crash import ExitInfo
    from distdoctor.diagnosis.engine.core import Engine
    from distdoctor.findings import Finding

    def told(ranks):
        return Finding("crash", "error", f"rank(s) {ranks} raised RuntimeError: boom",
                       list(ranks), details={"source": "log", "signature": "boom"})

    engine = Engine(30.0)
    for rank in (0, 1):
        engine.heartbeat(rank, 10**9, 0.0)
    engine.tick(0.0)
    engine.add_finding(told([0]))
    engine.tick(1.0)
    engine.exited(1, ExitInfo(1, "exit"))
    engine.tick(2.0)
    engine.add_finding(told([0, 1]))
    engine.tick(8.0)
    engine.exited(0, ExitInfo(1, "exit"))
    engine.tick(None, final=True)
    crashes = [f for f in engine.findings() if f.kind == "crash"]
    assert [(f.ranks, f.severity) for f in crashes] == [([0, 1], "error")], crashes
    assert "boom" in crashes[0].summary, crashes


@pytest.mark.timeout(150)
def test_an_exception_before_an_in_process_restart_is_one_finding_of_its_incarnation(tmp_path):
    """Both ranks logged the same exception (rank 1 a second later) and made a new process
    group (a new incarnation). Rank 1's report, an update of rank 0's, went to the new
    incarnation while rank 0's was held: two findings, one "every rank failed at
    start-up" in a launch that had not begun; and the old incarnation's, its logs closed,
    was said live as CRASH while the ranks trained on."""
    run_dir = tmp_path / "run"
    res = run_job("live_logs/reinit_after_exception.py", 2, run_dir, "7", timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "CRASH" not in res.stderr, res.stderr[-3000:]
    (f,) = [f for f in _findings(run_dir) if f["kind"] == "crash"]
    assert f["ranks"] == [0, 1] and f["severity"] == "warning", f
    assert f["summary"].startswith("incarnation 0:") and "start-up" not in f["summary"], f
