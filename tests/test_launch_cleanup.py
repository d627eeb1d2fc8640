"""`distdoctor run` leaves nothing behind: when it stops a job (a hang with --on-hang kill,
SIGTERM, Ctrl-C), when the job's command leaves processes behind, and when run itself is
SIGKILLed (its guardian stops the job).

Every test runs real processes. A process of the test's job is found independently of
distdoctor: its environment carries DISTDOCTOR_RUN_DIR=<the test's run dir> (or, for
distdoctor's own helpers, its command line names the run dir); the jobs also write their
pids. Whatever happens, each test SIGKILLs all of them at its end.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import JOBS, live_processes, run_cli

CLEANUP = JOBS / "cleanup"
pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc")


def _job_processes(run_dir: Path) -> list[int]:
    """Live processes (zombies do not count) tagged with this run dir: in their environment
    (the job's) or on their command line (distdoctor's helpers)."""
    tag = str(run_dir.resolve()).encode()
    return [pid for pid, env, argv in live_processes()
            if b"DISTDOCTOR_RUN_DIR=" + tag + b"\0" in env + b"\0" or tag in argv]


def _describe(pids: list[int]) -> str:
    lines = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().replace(b"\0", b" ").decode(errors="replace")
            lines.append(f"{pid}: {argv}")
        except OSError:
            lines.append(f"{pid}: gone")
    return "\n".join(lines)


def _wait_gone(run_dir: Path, timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while True:
        left = _job_processes(run_dir)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def _wait_for_files(folder: Path, prefix: str, count: int, timeout_s: float,
                    proc: subprocess.Popen) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pids = [int(p.name.split("-")[1]) for p in folder.glob(f"{prefix}-*")]
        if len(pids) >= count:
            return pids
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    raise AssertionError(f"{count} {prefix} pid files not written in {timeout_s} s "
                         f"(run: {proc.poll()})")


class Run:
    """`python -m distdoctor run ARGS` in a session of its own; its output is collected
    by `finish`."""

    def __init__(self, args: list[str]):
        self.proc = subprocess.Popen([sys.executable, "-m", "distdoctor", "run", *args],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, start_new_session=True,
                                     env=dict(os.environ, PYTHONUNBUFFERED="1"))
        self.started = time.monotonic()
        self.out = self.err = ""

    def finish(self, timeout_s: float) -> int:
        """Its exit code, once it and whatever holds its output have ended."""
        out, err = self.proc.communicate(timeout=timeout_s)
        self.out, self.err = out.decode(errors="replace"), err.decode(errors="replace")
        return self.proc.returncode


@pytest.fixture
def run_dir(tmp_path):
    """The run dir; afterwards, every process of the test's job is SIGKILLed, pass or fail."""
    path = tmp_path / "run"
    started: list[Run] = []
    yield path, started
    for run in started:
        if run.proc.poll() is None:
            try:
                os.killpg(run.proc.pid, signal.SIGKILL)
            except OSError:
                pass
            run.proc.wait()
    for pid in _job_processes(path):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _start(run_dir_fixture, args: list[str]) -> Run:
    path, started = run_dir_fixture
    run = Run(["--run-dir", str(path), *args])
    started.append(run)
    return run


def _exits(path: Path) -> dict:
    return json.loads((path / "exits.json").read_text())


@pytest.mark.timeout(150)
def test_on_hang_kill_stops_every_process_of_a_lightning_job(run_dir, tmp_path):
    """Lightning's ranks ignore SIGTERM while they wait in gloo, and torchrun starts them
    in sessions of their own: stopping torchrun's process group used to leave them
    running, orphaned."""
    pytest.importorskip("lightning")
    path = run_dir[0]
    run = _start(run_dir, ["--hang-timeout", "8", "--on-hang", "kill", "--grace", "2", "--",
                           sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc-per-node", "2", str(CLEANUP / "lightning_hang.py")])
    code = run.finish(120)
    left = _job_processes(path)
    assert not left, f"alive after run returned:\n{_describe(left)}\n{run.err}"
    assert code == 1, run.err
    assert "HANG" in run.err and "stopping the job (--on-hang kill)" in run.err, run.err
    exits = _exits(path)
    assert exits["stopped_by_distdoctor"] is True
    stopped = exits["stopped_processes"]
    assert sorted(p["rank"] for p in stopped) == [0, 1], stopped
    assert all(p["signal"] in ("SIGTERM", "SIGKILL") and "lightning_hang.py" in p["command"]
               for p in stopped), stopped
    ranks = {int(p["rank"]) for p in exits["processes"] if p["rank"] is not None
             and p["stopped_by_distdoctor"]}
    assert ranks == {0, 1}, exits


@pytest.mark.timeout(120)
def test_run_sigkilled_mid_job_leaves_no_process(run_dir, tmp_path):
    """run's guardian notices its death and stops the job: torchrun and its workers."""
    pids = tmp_path / "pids"
    pids.mkdir()
    path = run_dir[0]
    run = _start(run_dir, ["--grace", "2", "--", sys.executable, "-m", "torch.distributed.run",
                           "--standalone", "--nproc-per-node", "2",
                           str(CLEANUP / "allreduce_forever.py"), str(pids)])
    ranks = _wait_for_files(pids, "rank", 2, 90, run.proc)
    assert all(p in _job_processes(path) for p in ranks)
    os.kill(run.proc.pid, signal.SIGKILL)
    killed = time.monotonic()
    left = _wait_gone(path, 10)
    took = time.monotonic() - killed
    assert not left, f"alive 10 s after run was SIGKILLed:\n{_describe(left)}"
    assert took < 5, took
    run.finish(10)  # the guardian held run's stderr until it was done
    assert "run ended without stopping its job; stopped" in run.err, run.err
    exits = _exits(path)
    assert exits["stopped_by_distdoctor"] is True and exits["run_died"] is True
    assert sorted(p["rank"] for p in exits["processes"]) == [0, 1], exits
    notes = json.loads(run_cli(["diagnose", str(path), "--json"]).stdout)["notes"]
    assert any("`distdoctor run` died before the job ended" in n for n in notes), notes


@pytest.mark.timeout(60)
def test_a_daemon_that_ignores_sigterm_is_killed_after_grace_when_the_command_ends(run_dir,
                                                                                   tmp_path):
    """The job's command exits 0 and leaves a setsid'd grandchild that ignores SIGTERM:
    after --grace it is named in one line, sent SIGTERM, and SIGKILL after --grace more."""
    pids = tmp_path / "pids"
    pids.mkdir()
    path = run_dir[0]
    run = _start(run_dir, ["--grace", "1", "--", str(CLEANUP / "stubborn_daemon.py"),
                           str(pids), "exit"])
    code = run.finish(40)
    elapsed = time.monotonic() - run.started
    left = _job_processes(path)
    assert not left, f"alive after run returned:\n{_describe(left)}\n{run.err}"
    assert code == 0, run.err
    (daemon,) = [int(p.name.split("-")[1]) for p in pids.glob("daemon-*")]
    lines = [line for line in run.err.splitlines() if "process(es) of it remain" in line]
    assert len(lines) == 1 and f"{daemon} (" in lines[0], run.err
    exits = _exits(path)
    assert exits["stopped_by_distdoctor"] is False  # the command ended by itself
    assert [(p["pid"], p["signal"]) for p in exits["stopped_processes"]] == [
        (daemon, "SIGKILL")], exits
    assert elapsed >= 2, elapsed  # --grace before the SIGTERM, --grace before the SIGKILL


@pytest.mark.timeout(120)
@pytest.mark.parametrize("delay_s", [0.3, 0.6, 1.0])
def test_ctrl_c_while_the_job_starts_leaves_no_process(run_dir, tmp_path, delay_s):
    """Ctrl-C can come while run is still starting the ranks: it is kept and acted on once
    they run (as a KeyboardInterrupt it once left them running, holding run's output)."""
    path = run_dir[0]
    run = _start(run_dir, ["--nproc", "2", "--grace", "1", "--",
                           str(CLEANUP / "stubborn_daemon.py"), str(tmp_path), "wait"])
    time.sleep(delay_s)
    os.kill(run.proc.pid, signal.SIGINT)
    code = run.finish(60)
    left = _job_processes(path)
    assert not left, f"alive after run returned:\n{_describe(left)}\n{run.err}"
    assert code != 0 and "Traceback" not in run.err, run.err


@pytest.mark.timeout(90)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_signal_to_run_stops_ranks_and_their_detached_children(run_dir, tmp_path, sig):
    """SIGTERM (a scheduler's cancel), SIGINT (Ctrl-C) or SIGHUP (its terminal closed) to
    run: the ranks and the daemons they started in sessions of their own (ignoring
    SIGTERM) all end; exit codes and exits.json are written (a hang-up once killed run
    itself, and its guardian stopped the job: no exit codes, no last diagnosis)."""
    pids = tmp_path / "pids"
    pids.mkdir()
    path = run_dir[0]
    run = _start(run_dir, ["--nproc", "2", "--grace", "1", "--",
                           str(CLEANUP / "stubborn_daemon.py"), str(pids), "wait"])
    mains = _wait_for_files(pids, "main", 2, 60, run.proc)
    daemons = _wait_for_files(pids, "daemon", 2, 5, run.proc)
    os.kill(run.proc.pid, sig)
    code = run.finish(30)
    left = _job_processes(path)
    assert not left, f"alive after run returned:\n{_describe(left)}\n{run.err}"
    assert code == {signal.SIGTERM: 143, signal.SIGINT: 1, signal.SIGHUP: 129}[sig], run.err
    exits = _exits(path)
    assert exits["stopped_by_distdoctor"] is True
    assert sorted(p["pid"] for p in exits["processes"]) == sorted(mains)
    # SIGTERM first: the ranks (no handler) end of it; the daemons (ignoring it) of SIGKILL
    assert all(p["stopped_by_distdoctor"] and p["signal"] == "SIGTERM"
               for p in exits["processes"]), exits
    assert sorted((p["pid"], p["signal"]) for p in exits["stopped_processes"]) == sorted(
        (d, "SIGKILL") for d in daemons), exits
