"""Issue 47's behaviour: a failure log read as the job's story. Where in the story a failure
happened, how every log ends (stopped with no error, killed from outside, finished), the
cause printed before the symptom, colour codes that lost their ESC, ranks read right.

Fixtures: tests/fixtures/logs/round5/ (each with a sidecar naming the project and version
whose format it is written in, and what a right diagnosis says); two real torchrun + gloo
jobs (tests/jobs/logstory/story_job.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from logtests import says_what_its_sidecar_expects, warned_of, write_named

from distdoctor.logs import scan_logs
from distdoctor.logs.lines import parse_line
from distdoctor.logs.story import read_story

ROUND5 = Path(__file__).parent / "fixtures" / "logs" / "round5"
JOB = Path(__file__).parent / "jobs" / "logstory" / "story_job.py"


@pytest.mark.parametrize("log", sorted(ROUND5.glob("*.log")), ids=lambda p: p.stem)
def test_each_fixture_says_what_its_sidecar_expects(log):
    assert "how it ends: " in says_what_its_sidecar_expects(log)


# --- colour codes that lost their ESC ------------------------------------------------------
@pytest.mark.parametrize("head", ["[36m(WorkerDict pid=41873, ip=10.0.0.7)[0m ",
                                  "[1;31m[36m(WorkerDict pid=41873, ip=10.0.0.7)[0m[0m "])
def test_a_lost_escape_is_peeled_like_a_prefix(head):
    line = parse_line(head + "[rank13]:[E1104 04:11:09.401256342 ProcessGroupNCCL.cpp:632] "
                      "[Rank 1] Watchdog")
    assert (line.rank, line.pid, line.host) == (13, 41873, "10.0.0.7")
    assert line.text == "[Rank 1] Watchdog"


def test_brackets_that_are_text_are_kept():
    for text in ("timeout [5m] reached", "[model] loaded", "lr [1e-3]"):
        assert parse_line(text).text == text


# --- how a log ends --------------------------------------------------------------------------
STEPS = "".join(f"[2025-01-01 10:00:{s:02d}] INFO step {s} | loss 1.0\n" for s in range(1, 6))


def test_a_finished_log_is_quiet_and_says_it_finished(tmp_path):
    text = STEPS + "[2025-01-01 10:00:07] INFO Training completed. train_runtime 7.0\n"
    found, read = scan_logs([write_named(tmp_path, "ok.log", text)])
    assert not warned_of(found) and read.endswith("how it ends: finished")


def test_a_log_that_just_ends_mid_run_is_said_but_not_alarmed(tmp_path):
    found, read = scan_logs([write_named(tmp_path, "mid.log", STEPS)])
    assert not warned_of(found)
    assert "ends mid-run with no error" in read and "last progress: step 5" in read


# the last words of a job stopped from outside: kubectl's (a container's exit code 128 + 9),
# Lightning's SIGTERM handler, a shell's; (what the summary must say)
KILLED_ENDS = [("command terminated with exit code 137\n", "SIGKILL"),
               ("[rank: 0] Received SIGTERM: 15\nBypassing SIGTERM: 15\n", "SIGTERM"),
               ("Terminated\n", "'Terminated'")]


@pytest.mark.parametrize("end,says", KILLED_ENDS, ids=["kubectl", "lightning", "shell"])
def test_a_log_killed_from_outside_says_so_with_its_last_progress(tmp_path, end, says):
    found, read = scan_logs([write_named(tmp_path, "k.log", STEPS + end)])
    (top,) = warned_of(found)
    assert top.severity == "warning" and "killed from outside after step 5" in top.summary
    assert says in top.summary and read.endswith("how it ends: killed from outside")


def test_kill_words_far_from_the_end_are_not_how_it_ended(tmp_path):
    text = "Received SIGTERM in a helper, ignoring\n" + STEPS * 4 + \
        "[2025-01-01 10:00:09] INFO Training completed.\n"
    assert not warned_of(scan_logs([write_named(tmp_path, "ok.log", text)])[0])


def test_the_story_places_a_line_after_its_last_step(tmp_path):
    path = write_named(tmp_path, "s.log", STEPS + "RuntimeError: boom\n")
    story = read_story([path], {path: 6})
    fs = story.files[path]
    assert [m.step for m in fs.milestones] == [1, 2, 3, 4, 5]
    assert story.where(fs.tail[-1]) == "after step 5"


# --- real jobs: torchrun + gloo --------------------------------------------------------------
def _torchrun(tmp_path: Path, fault: str, stop_when: str | None = None) -> str:
    """The job's combined output as a log file; `stop_when`: SIGTERM to torchrun once the
    output holds that text twice (once per rank). Hard timeout; every process killed."""
    from distdoctor.launch.env import free_port

    log = tmp_path / f"{fault}.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
             "--master-port", str(free_port()), str(JOB), "--fault", fault,
             "--port", str(free_port())],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
        try:
            deadline = time.monotonic() + 40
            while stop_when and time.monotonic() < deadline and proc.poll() is None:
                if log.read_text().count(stop_when) >= 2:
                    proc.send_signal(signal.SIGTERM)
                    break
                time.sleep(0.2)
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        finally:
            if proc.poll() is None or stop_when:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()
    return str(log)


@pytest.mark.timeout(60)
def test_a_real_killed_sibling_is_said_after_its_last_step(tmp_path):
    found, _ = scan_logs([_torchrun(tmp_path, "sibling-killed")])
    top = warned_of(found)[0]
    assert top.ranks == [1] and "SIGKILL" in top.summary, top.summary
    assert "(after step 3)" in top.summary and top.details["story"] == "after step 3"


@pytest.mark.timeout(60)
def test_a_real_store_that_never_fills_then_a_sigterm_says_where_it_stood(tmp_path):
    found, read = scan_logs([_torchrun(tmp_path, "store-never-fills",
                                       stop_when="most recent call first")])
    top = warned_of(found)[0]
    assert "received SIGTERM" in top.summary, top.summary
    assert "stack dump showed the job stuck in _create_c10d_store" in top.summary
    assert "story_job.py" in top.summary and "at init, before the first step" in top.summary


def test_a_cause_said_as_a_warning_is_how_it_ended_not_a_kill():
    """The launcher's SIGTERMs after a worker raised (then a restart that failed to join):
    the exception is the ending, not a kill from outside."""
    log = Path(__file__).parent / "fixtures" / "logs" / "field" / "srun_rdzv_closed_two_nodes.log"
    found, read = scan_logs([str(log)])
    assert not [f for f in found if f.details.get("family") == "ending"]
    assert "how it ends: failed: rank 2 raised RuntimeError" in read
