"""Round six: a supervisor's own SIGKILL is no OOM kill (Lightning's process observer), a
launcher's unranked exit is the unranked traceback's process, an out-of-memory its process
caught and trained past is no failure, and NCCL transport errors seen by the ranks that lost
a crashed peer are that crash's consequences. Fixtures: tests/fixtures/logs/round6/ (each
with a sidecar: recorded here, or written from the named formats, and what a right diagnosis
says)."""

from __future__ import annotations

from pathlib import Path

import pytest
from logtests import says_what_its_sidecar_expects, warned_of, write_named

from distdoctor.logs import scan_logs

ROUND6 = Path(__file__).parent / "fixtures" / "logs" / "round6"
OBSERVER = ("[rank: 0] Child process with PID 4242 terminated with code 1. Forcefully "
            "terminating all other processes to avoid zombies 🧟\n")


@pytest.mark.parametrize("log", sorted(ROUND6.glob("*.log")), ids=lambda p: p.stem)
def test_each_fixture_says_what_its_sidecar_expects(log):
    says_what_its_sidecar_expects(log)


@pytest.mark.parametrize("killed", ["Killed\n", "./train.sh: line 7: 4240 Killed    python t.py\n"])
def test_a_shell_killed_right_after_a_supervisor_kills_all_is_no_oom_kill(tmp_path, killed):
    tb = ("Traceback (most recent call last):\n  File \"/w/t.py\", line 9, in step\n"
          "ValueError: shard 3 is empty\n")
    (top,) = warned_of(scan_logs([write_named(tmp_path, "a.log", tb + OBSERVER + killed)])[0])
    assert "ValueError" in top.summary and "OOM" not in top.summary
    # the same shell word with no supervisor's kill before it is still the OOM killer's
    far = "step 1 | loss 0.3\n" * 250
    found = warned_of(scan_logs([write_named(tmp_path, "b.log", OBSERVER + far + killed)])[0])
    assert any("OOM killer killed a process" in f.summary for f in found)


def test_an_oom_caught_then_stalled_stays_an_alarm(tmp_path):
    """A caught OOM with no step reported after it (every batch fails again, metaseq's
    endless loop) is not a recovery."""
    oom = ("2026-01-02 10:00:0{i} | WARNING | fairseq.trainer | OOM: Ran out of memory with "
           "exception: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 39.39 GiB total "
           "capacity; 37.0 GiB already allocated; 1.0 GiB free; 38 GiB reserved)\n")
    body = "".join(oom.format(i=i) for i in range(5))
    (top,) = warned_of(scan_logs([write_named(tmp_path, "a.log", body)])[0])
    assert "CUDA out of memory" in top.summary


# recorded here: coreutils' wrappers run with torchrun not on PATH (LANG=C, and UTF-8 quotes)
NOT_FOUND = ["timeout: failed to run command ‘torchrun’: No such file or directory",
             "nohup: failed to run command 'torchrun': No such file or directory",
             "stdbuf: failed to run command 'torchrun': No such file or directory",
             "nice: 'torchrun': No such file or directory"]


@pytest.mark.parametrize("line", NOT_FOUND, ids=lambda s: s.split(":")[0])
def test_a_launcher_a_wrapper_could_not_run_is_said(tmp_path, line):
    (top,) = warned_of(scan_logs([write_named(tmp_path, "job.log", line + "\n")])[0])
    assert "launcher could not start" in top.summary and "torchrun" in top.summary


def test_a_stop_word_after_the_end_of_training_is_still_a_kill(tmp_path):
    """The helper's SIGTERM before 'training finished' is quiet (fixture above); the same
    words after it, at the log's end, are the job's processes ended from outside."""
    log = (ROUND6 / "helper_sigterm_then_finished.log").read_text()
    (top,) = warned_of(scan_logs([write_named(tmp_path, "a.log", log + "Terminated\n")])[0])
    assert "killed from outside" in top.summary


def test_an_exception_after_which_training_only_went_on_stays_an_alarm(tmp_path):
    """A caught exception is quiet only where the end of training follows it: steps printed
    after it (other ranks' lines, unlabelled) do not show its process survived."""
    log = (ROUND6 / "exception_logged_then_finished.log").read_text()
    cut = log[:log.index("training finished")]
    assert warned_of(scan_logs([write_named(tmp_path, "a.log", cut)])[0])
