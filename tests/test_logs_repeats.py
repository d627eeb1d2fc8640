"""The stall no rule names (distdoctor/logs/repeats.py): a log that ends in one line over and
over with nothing moving. Real output of a hung torchrun job, and the healthy look-alikes:
counters that move, heartbeats beside progress, a crash the waiting follows, too few repeats
to tell. The projects' own formats are fixtures in tests/fixtures/logs/round4/."""

from __future__ import annotations

import contextlib
import gzip
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from logtests import warned_of

from distdoctor.launch.env import free_port
from distdoctor.logs import scan_logs
from distdoctor.logs.repeats import TAIL_BYTES, repeating_tail, tail_lines, template

JOBS = Path(__file__).parent / "jobs"


def _write(tmp_path: Path, text: str, name: str = "job.log") -> str:
    p = tmp_path / name
    p.write_text(text)
    return str(p)


def _waits(n: int, line: str, start_min: int = 0) -> list[str]:
    return [f"2026-02-03 10:{start_min + i:02d}:00,000 INFO {line.format(i=i)}" for i in range(n)]


def test_a_template_masks_time_and_tries_and_keeps_counters():
    t, values = template("still at step 42 after 1m30s (attempt 3/10), 2026-02-03 10:00:01")
    assert t == "still at step <N> after <T> (<TRY>), <T>" and values == ("42",)


def test_a_wait_repeated_with_a_moving_try_count_is_a_stall(tmp_path):
    log = _write(tmp_path, "\n".join(
        ["2026-02-03 09:59:00,000 INFO train: starting"] + _waits(
            6, "store: retrying connection to 10.0.0.7:29500 (attempt {i}/30), waiting 60 s")))
    (top,) = warned_of(scan_logs([log])[0])
    assert top.kind == "hang" and top.severity == "error" and "6 times" in top.summary
    assert "over 300 s" in top.summary and "10.0.0.7:29500" in top.summary and top.ranks == []


def test_a_counter_that_moves_is_progress_not_a_stall(tmp_path):
    log = _write(tmp_path, "\n".join(_waits(8, "waiting for batch {i}: data loader slow")))
    assert warned_of(scan_logs([log])[0]) == []


def test_a_crash_the_waiting_follows_is_the_cause(tmp_path):
    lines = ["[rank1]: Traceback (most recent call last):",
             '[rank1]:   File "train.py", line 9, in <module>',
             "[rank1]: ValueError: bad batch shape"]
    lines += [f"[rank0]: {x}" for x in _waits(6, "still waiting for rank 1 at step 7")]
    found = warned_of(scan_logs([_write(tmp_path, "\n".join(lines))])[0])
    assert found and "ValueError" in found[0].summary
    assert not any("the same line" in f.summary for f in found), [f.summary for f in found]


def test_untimed_repeats_need_more_of_them_and_are_only_a_warning(tmp_path):
    eight = _write(tmp_path, "x\n" + "waiting for the parameter server\n" * 8, "eight.log")
    assert warned_of(scan_logs([eight])[0]) == []
    twelve = _write(tmp_path, "x\n" + "waiting for the parameter server\n" * 12, "12.log")
    (top,) = warned_of(scan_logs([twelve])[0])
    assert top.severity == "warning" and "the log shows no times" in top.summary


def test_healthy_ends_that_repeat_a_line_are_no_stall(tmp_path):
    """A job that finished after its waits; unlabelled ranks' one farewell, untimed or all
    at one moment."""
    done = _waits(20, "ckpt: waiting for the upload to finish") + [
        "2026-02-03 10:20:00,000 INFO ckpt: upload finished, exiting"]
    farewell = ["Finished training at step 1000"] * 16
    at_once = ["2026-02-03 10:00:02,000 INFO Waiting for all ranks before exit"] * 8
    for name, lines in (("done", done), ("farewell", farewell), ("at_once", at_once)):
        path = _write(tmp_path, "\n".join(["step 999 loss 0.5"] + lines) + "\n", name + ".log")
        assert warned_of(scan_logs([path])[0]) == [], name


@pytest.mark.timeout(60)  # a hang guard: they once took minutes (backtracking, a min() a line)
def test_odd_tails_are_read_and_said_to_be_no_stall(tmp_path):
    """A 200,000-digit line, and 40,000 distinct lines."""
    digits = _write(tmp_path, "start\n" + "7" * 200_000 + "\n", "digits.log")
    distinct = _write(tmp_path, "".join(f"line {i:x} of its own\n" for i in range(40_000)),
                      "distinct.log")
    for path in (digits, distinct):
        assert repeating_tail(tail_lines(path)) == [] and warned_of(scan_logs([path])[0]) == []


def test_a_line_repeated_without_a_wait_word_is_no_stall(tmp_path):
    log = _write(tmp_path, "\n".join(_waits(8, "GPU memory 40.1 GiB of 80.0 GiB")))
    assert warned_of(scan_logs([log])[0]) == []


def test_the_tail_of_a_large_or_gzipped_file_keeps_its_line_numbers(tmp_path):
    body = [f"2026-02-03 08:00:00,000 INFO step {i} loss 1.0" for i in range(20_000)]
    tail = _waits(5, "heartbeat: still waiting in barrier at step 19999")
    text = "\n".join(body + tail) + "\n"
    assert len(text) > 2 * TAIL_BYTES
    plain = _write(tmp_path, text, "big.log")
    packed = tmp_path / "big.log.gz"
    packed.write_bytes(gzip.compress(text.encode()))
    for path in (plain, str(packed)):
        (r,) = repeating_tail(tail_lines(path, 20_005))
        assert (r.count, r.first.lineno, r.last.lineno, r.span_s) == (5, 20_001, 20_005, 240)
        (top,) = warned_of(scan_logs([path])[0])
        assert "5 times" in top.summary and top.severity == "error"


@pytest.mark.timeout(90)
def test_a_hung_torchrun_job_whose_heartbeat_repeats_is_said_as_the_stall(tmp_path):
    """Real output: torchrun --tee 3 of a job hung at step 4, read while it hangs."""
    out = tmp_path / "job.log"
    with open(out, "wb") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--tee", "3",
             "--master-port", str(free_port()), str(JOBS / "heartbeat_stuck.py")],
            stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while out.read_text().count("still at step 4") < 8 and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        # torchrun puts each rank in a session of its own: its group alone leaves them
        ranks = psutil.Process(proc.pid).children(recursive=True)
        os.killpg(proc.pid, signal.SIGKILL)
        for rank in ranks:
            with contextlib.suppress(psutil.Error):
                rank.kill()
        proc.wait(timeout=30)
    text = out.read_text()
    assert text.count("still at step 4") >= 8, text[-2000:]
    (top,) = warned_of(scan_logs([str(out)])[0])
    assert top.kind == "hang" and "still at step 4" in top.summary and "rank 0" in top.summary
    assert top.severity == "warning"  # seconds of it: the job may yet go on


def test_two_ranks_stalled_on_one_line_read_the_same_whatever_the_hash_seed():
    """Which rank's repeated line a stall quotes followed a set's order, so the same log
    read in two processes could say "rank 0" once and "rank 1" the next time."""
    log = Path(__file__).parent / "fixtures" / "logs" / "round4" / "user_heartbeat_stuck_step.log"
    code = ("import sys; from distdoctor.logs import scan_logs; "
            "print(scan_logs([sys.argv[1]])[0][0].summary)")
    said = {subprocess.run([sys.executable, "-c", code, str(log)], capture_output=True,
                           text=True, timeout=60, env=dict(os.environ, PYTHONHASHSEED=str(seed)),
                           check=True).stdout for seed in range(1, 5)}
    assert len(said) == 1, said
