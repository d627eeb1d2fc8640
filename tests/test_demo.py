"""`distdoctor demo`: printed findings without a terminal; on a terminal (a real pty here)
the job runs behind the dashboard and quitting the dashboard stops it cleanly."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import signal
import struct
import sys
import termios
import time

import pytest
from conftest import _kill_ranks, run_cli

from distdoctor.errors import UserError
from distdoctor.runlog.reader import RankLog
from distdoctor.runlog.rundir import ring_path


@pytest.mark.timeout(180)
def test_demo_without_a_terminal_prints_the_finding_live(tmp_path):
    run_dir = tmp_path / "run"
    proc = run_cli(["demo", "--nproc", "2", "--steps", "6", "--hang-timeout", "5",
                    "--inject", "mismatch:rank=1,step=3", "--run-dir", str(run_dir)],
                   timeout=150, run_dir=run_dir)
    assert proc.returncode != 0  # stopped on the hang the mismatch causes
    assert "distdoctor demo" in proc.stderr and "distdoctor watch" in proc.stderr
    assert "MISMATCH" in proc.stderr and "rank 1" in proc.stderr, proc.stderr[-3000:]
    assert not (run_dir / "job.log").exists()  # no dashboard: output went to the terminal


def _read_until(fd: int, needle: bytes, timeout_s: float, seen: bytearray) -> bool:
    """Read the pty until `needle` (a regular expression) has appeared in `seen`."""
    found = re.compile(needle).search
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(fd, 65536)
            except OSError:  # the child closed the pty
                return bool(found(seen))
            if not chunk:
                return bool(found(seen))
            seen.extend(chunk)
            if found(seen):
                return True
    return False


def _wait_draining(pid: int, fd: int, timeout_s: float, seen: bytearray) -> int:
    """The child's wait status, reading its terminal meanwhile; fails after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        _read_until(fd, rb"(?!)", 0.5, seen)  # (a pattern that never matches)
    pytest.fail(f"the demo did not exit within {timeout_s} s:\n"
                f"{bytes(seen[-3000:]).decode(errors='replace')}")


def _events(run_dir, rank: int) -> int:
    try:
        log = RankLog(ring_path(run_dir, rank))
    except UserError:  # not created yet
        return 0
    try:
        return log.header().head
    finally:
        log.close()


@pytest.mark.timeout(180)
@pytest.mark.parametrize("how", ["q", "hangup"])
def test_demo_on_a_terminal_runs_behind_the_dashboard_and_stops_with_it(how, tmp_path):
    """`q` quits the dashboard; a hang-up (the terminal closed) kills the demo: either way
    the job behind it is stopped through `run`'s wind-down, never left running."""
    run_dir = tmp_path / "run"
    pid, fd = pty.fork()
    if pid == 0:  # the child: distdoctor demo on a 160x48 terminal
        os.environ["TERM"] = "xterm-256color"
        os.execv(sys.executable, [sys.executable, "-m", "distdoctor", "demo", "--nproc", "2",
                                  "--steps", "100000", "--run-dir", str(run_dir)])
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 48, 160, 0, 0))
    seen = bytearray()
    try:
        # the dashboard is up with both ranks, and they train (the screen is redrawn in
        # changed fragments only, so progress is read from the run dir, not the screen)
        assert _read_until(fd, rb"ranks 2/2 \(2 alive\)", 90, seen), bytes(seen[-3000:])
        deadline = time.monotonic() + 90
        while min(_events(run_dir, r) for r in (0, 1)) < 50:
            assert time.monotonic() < deadline, "the ranks made no progress"
            _read_until(fd, rb"(?!)", 0.5, seen)  # keep the pty drained meanwhile
        assert (run_dir / "job.log").exists()
        if how == "q":
            os.write(fd, b"q")
            assert _read_until(fd, b"the job's output", 90, seen), bytes(seen[-3000:])
        else:
            os.kill(pid, signal.SIGHUP)
        status = _wait_draining(pid, fd, 120, seen)  # a full pty would block its writes
        pid = 0
    finally:
        if pid:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        os.close(fd)
        _kill_ranks(run_dir)
    exits = json.loads((run_dir / "exits.json").read_text())
    assert exits["stopped_by_distdoctor"] and len(exits["processes"]) == 2
    log = (run_dir / "job.log").read_text()
    assert "reference_trainer: world 2" in log and "stopped by distdoctor" in log, log
    if how == "q":
        assert os.waitstatus_to_exitcode(status) == 0  # the user's quit is no failure
        tail = bytes(seen).decode(errors="replace")
        assert "2 rank(s) traced" in tail, tail[-2000:]  # run's summary, shown after
    else:
        assert os.waitstatus_to_exitcode(status) == 128 + signal.SIGHUP
