"""`distdoctor run` relays and scans what its ranks print, and its own output may lose its
reader: neither costs the job, the exit code, run's memory, `--on-hang kill` or a false
finding.

Real 2-rank jobs (gloo) under `distdoctor run`, each with a hard timeout; a job that
outlives it fails the test, and every process of it is killed at the test's end (found by
the run dir in its environment). Before these checks, a rank printing at full speed kept
the hang from ever being stopped; lines of 100,000 characters took run 372 MB for 100 MB
of output; a reader of run's stderr that left ended the live diagnosis (no hang ever
stopped) or run's exit code; a closed stdout blocked the job for good; a rank quoting
torchrun's report of a failed rank made a healthy one a crash."""

from __future__ import annotations

import json
import mmap
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import JOBS, live_processes, run_job

from tests.peak_memory import run_measured

HOSTILE = JOBS / "security" / "hostile_ranks"
pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc")


def _left(run_dir: Path) -> list[int]:
    """Live processes of the job (zombies do not count): its run dir in their environment."""
    tag = b"DISTDOCTOR_RUN_DIR=" + str(run_dir.resolve()).encode() + b"\0"
    return [pid for pid, env, _ in live_processes() if tag in env + b"\0"]


@pytest.fixture
def run_dir(tmp_path):
    """The run dir; afterwards every process of its job is SIGKILLed, pass or fail."""
    path = tmp_path / "run"
    yield path
    for pid in _left(path):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _run(run_dir: Path, job: list[str], timeout_s: float, **popen) -> int:
    """`distdoctor run --nproc 2 ... -- JOB`, its exit code; killed (its guardian then
    stops the job) and failed after `timeout_s`. `popen`: where its output goes."""
    proc = subprocess.Popen([sys.executable, "-m", "distdoctor", "run", "--nproc", "2",
                             "--run-dir", str(run_dir), "--grace", "2", "--on-hang", "kill",
                             "--", *job], stdin=subprocess.DEVNULL, start_new_session=True,
                            **popen)
    if popen.get("stderr") == subprocess.PIPE:  # its reader leaves after the first line
        assert proc.stderr.readline().startswith(b"distdoctor: tracing into")
        proc.stderr.close()
    try:
        return proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        pytest.fail(f"distdoctor run did not end in {timeout_s} s")


def _stopped_for_the_hang(run_dir: Path, code: int) -> None:
    assert code == 1
    kinds = [f["kind"] for f in json.loads((run_dir / "findings.json").read_text())["findings"]]
    assert "hang" in kinds, kinds
    assert json.loads((run_dir / "exits.json").read_text())["stopped_by_distdoctor"] is True
    assert not _left(run_dir)


@pytest.mark.timeout(150)
def test_a_hang_is_stopped_while_a_rank_prints_at_full_speed(run_dir, tmp_path):
    """Rank 0 prints stderr lines as fast as it can while it waits for rank 1: each pass
    of the live diagnosis scanned the job's output until none was pending, which never
    came, so the hang was never diagnosed."""
    code = _run(run_dir, [str(HOSTILE / "stuck.py"), str(tmp_path), "spam"], 90,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _stopped_for_the_hang(run_dir, code)


@pytest.mark.timeout(150)
def test_a_reader_of_runs_stderr_that_leaves_costs_neither_the_stop_nor_the_exit_code(
        run_dir, tmp_path):
    """`distdoctor run ... 2>&1 | head`: the first finding printed after the reader left
    (a log line's, before the hang's) raised SystemExit in the diagnosis thread (rich's
    answer to a closed pipe), which ended it: the hang was never stopped."""
    code = _run(run_dir, [str(HOSTILE / "stuck.py"), str(tmp_path), "warns"], 60,
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _stopped_for_the_hang(run_dir, code)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("closed,stream", [(1, "stdout"), (2, "stderr")])
def test_runs_own_stdout_or_stderr_closed_never_blocks_the_job(run_dir, closed, stream):
    """Started with its stdout (or stderr) closed, run relayed the ranks' output to None:
    the relay thread died with a traceback, rank 0 blocked once its pipe was full, and
    --on-hang kill stopped the job as a hang of rank 0, one of distdoctor's making."""
    code = _run(run_dir, [str(HOSTILE / "loud.py"), "1", "3", stream], 60,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                preexec_fn=lambda: os.close(closed))
    assert code == 3  # the job's
    assert not _left(run_dir)


@pytest.mark.timeout(150)
def test_long_lines_keep_runs_memory_bounded_and_pass_through_whole(run_dir, tmp_path):
    """Rank 0 prints 100 MiB in lines of 100,000 four-byte characters: run's peak memory
    stays bounded (the scanner's pending lines are bounded in characters, not only in
    count), every byte reaches run's stdout, and the job's exit code is run's."""
    job = ["run", "--nproc", "2", "--run-dir", str(run_dir), "--", str(HOSTILE / "loud.py"),
           "100", "3"]
    run = run_measured(job, tmp_path, timeout_s=120, read_out=False)
    assert run.code == 3, run.err[-3000:]
    assert run.peak_mb < 150, run.peak_mb
    update = "\U0001f525 45%|####      |\r"
    line = len((update * (100_000 // len(update)) + "\n").encode())
    out = tmp_path / "measured.out"
    assert out.stat().st_size == (100 << 20) // line * line + 2 * len("rank 0 done\n")
    with open(out, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as whole:
        # rank 0's last line after its 100 MiB; rank 1's, relayed from a pipe of its own,
        # whole (at a line's start) wherever it fell among rank 0's lines
        assert whole.rfind(b"\nrank 0 done\n") > whole.rfind(b"|\r\n")
        first = 0 if whole[:12] == b"rank 1 done\n" else whole.find(b"\nrank 1 done\n")
        assert first >= 0 and whole.find(b"rank 1 done", first + 2) == -1
    assert "Traceback" not in run.err


@pytest.mark.timeout(120)
def test_a_rank_quoting_torchruns_report_is_no_crash_of_another(run_dir):
    """Rank 0 prints torchrun's lines for a failed rank 1 ("exitcode : -9"): read as the
    report of a launcher run wraps, they made rank 1, alive and healthy, a crash killed
    by SIGKILL. Ranks that run starts itself have no launcher to report them."""
    done = run_job("security/hostile_ranks/quotes_torchrun.py", 2, run_dir)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "rank 0 done" in done.stdout and "rank 1 done" in done.stdout
    findings = json.loads((run_dir / "findings.json").read_text())["findings"]
    assert findings == [], findings


@pytest.fixture
def pids_limit(tmp_path):
    """A cgroup (v1 pids) whose process and thread count the test sets; skipped where
    one cannot be made (not root, no pids controller)."""
    group = Path("/sys/fs/cgroup/pids") / f"distdoctor-test-{os.getpid()}"
    try:
        group.mkdir()
    except OSError as exc:
        pytest.skip(f"cannot make a pids cgroup here: {exc}")
    yield group
    for _ in range(50):  # its processes are gone once run has returned; a zombie lingers
        try:
            group.rmdir()
            return
        except OSError:
            subprocess.run(["sleep", "0.1"])


@pytest.mark.timeout(120)
def test_no_thread_left_for_the_relay_is_one_line_and_no_process_left(pids_limit, tmp_path):
    """Under a limit on processes and threads (a container's pids.max), run could start a
    rank but not the thread relaying its output, or not its live diagnosis: a traceback
    (its guardian then stopped the ranks). Each limit from too few for anything to enough
    for the job: one line, or the job's own exit code."""
    said = set()
    for limit in range(2, 14):
        (pids_limit / "pids.max").write_text(str(limit))
        run_dir = tmp_path / f"run-{limit}"
        proc = subprocess.run(
            [sys.executable, "-m", "distdoctor", "run", "--nproc", "4", "--run-dir",
             str(run_dir), "--", "/bin/true"], capture_output=True, text=True, timeout=60,
            stdin=subprocess.DEVNULL,
            preexec_fn=lambda: (pids_limit / "cgroup.procs").write_text(str(os.getpid())))
        assert "Traceback" not in proc.stderr, (limit, proc.stderr[-3000:])
        if proc.returncode != 0:
            (line,) = [x for x in proc.stderr.splitlines() if "error" in x]
            assert proc.returncode == 2 and "run: cannot start" in line, (limit, proc.stderr)
            said.add(line.split(": ")[-1])
        assert not _left(run_dir)
    assert "can't start new thread" in said, said


@pytest.mark.timeout(150)
@pytest.mark.parametrize("when", ["before run starts", "while it runs"])
def test_a_non_blocking_stdout_that_fills_loses_nothing(run_dir, when):
    """run's stdout shares its open file with something that made it non-blocking (a
    terminal another program left so, a pipe its reader set so): once its reader lags,
    every write fails with EAGAIN. The relay dropped what it could not write at once,
    and run's own first EAGAIN pointed its stdout at /dev/null for good."""
    import fcntl
    import time

    def non_blocking(fd):
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)

    read_end, write_end = os.pipe()
    if when == "before run starts":
        non_blocking(write_end)
    proc = subprocess.Popen([sys.executable, "-m", "distdoctor", "run", "--nproc", "2",
                             "--run-dir", str(run_dir), "--grace", "2", "--",
                             str(HOSTILE / "loud.py"), "1"], stdin=subprocess.DEVNULL,
                            stdout=write_end, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    got = bytearray()
    try:
        if when == "while it runs":  # the flag is the open file's: run's descriptor too
            time.sleep(1)
            non_blocking(write_end)
        os.close(write_end)
        time.sleep(3)  # the reader lags: the pipe fills, and stays full a while
        with os.fdopen(read_end, "rb") as reader:
            deadline = time.monotonic() + 90
            while chunk := reader.read1(1 << 16):
                got += chunk
                assert time.monotonic() < deadline, "run's output never ended"
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    text = bytes(got).decode("utf-8", "replace")
    per_line = 100_000 // 18  # loud.py: updates of 18 characters (21 bytes) to a line
    lines = (1 << 20) // (per_line * 21 + 1)
    assert text.count("\U0001f525 45%") == lines * per_line, len(got)
    assert "rank 0 done" in text and "rank 1 done" in text, text[-500:]


@pytest.mark.timeout(150)
def test_a_stalled_stdout_does_not_stall_the_ranks_stderr(run_dir):
    """`distdoctor run ... | less` (stdout's reader waits for a key, stderr is the
    terminal): one lock served every relay, so once stdout was full the ranks' stderr
    waited behind it too, and a rank that only logs stalled where bare it runs on."""
    import time

    proc = subprocess.Popen([sys.executable, "-m", "distdoctor", "run", "--nproc", "2",
                             "--run-dir", str(run_dir), "--grace", "2", "--",
                             str(HOSTILE / "two_streams.py")], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    logged = False
    try:
        os.set_blocking(proc.stderr.fileno(), False)
        deadline, seen = time.monotonic() + 60, b""
        while not logged and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.1)
            seen += proc.stderr.read() or b""
            logged = b"RANK 1 LOGGED" in seen
        os.set_blocking(proc.stderr.fileno(), True)
        proc.communicate(timeout=60)  # stdout read at last: the job ends
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert logged, seen[-2000:]
    assert proc.returncode == 0
