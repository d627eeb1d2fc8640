"""What the world does to distdoctor's files while a job runs: a full disk, a run dir
deleted. The job's outcome must be what it would be without distdoctor, and distdoctor
says what it lost in one line."""

import contextlib
import json
import os
import shutil
import subprocess

import pytest
from conftest import JOBS, run_cli, small_disk

from distdoctor.runlog.run import read_incarnations

pytestmark = pytest.mark.timeout(240)
CHAOS = JOBS / "chaos"


def test_a_disk_that_fills_up_mid_job_costs_events_not_the_job(tmp_path):
    """A store into a mapped page a full disk cannot back is SIGBUS in the rank; the
    writer reserves space ahead of itself and, on a full disk, counts what it drops."""
    with small_disk(tmp_path / "disk", "8m") as disk:
        run_dir = disk / "run"
        res = run_cli(["run", "--nproc", "2", "--run-dir", str(run_dir), "--",
                       str(CHAOS / "fill_disk.py")], run_dir=run_dir, timeout=200)
        assert res.returncode == 0, res.stderr[-3000:]
        assert "rank 0 done" in res.stdout and "rank 1 done" in res.stdout
        assert "disk under the run dir is full" in res.stderr
        assert "Traceback" not in res.stderr
        os.remove(run_dir / "filler")
        notes = json.loads(run_cli(["diagnose", str(run_dir), "--json"]).stdout)["notes"]
        assert any("were not recorded (the disk under the run dir was full)" in n
                   for n in notes), notes
        run = read_incarnations(run_dir)[-1]
        assert sum(h.unrecorded for h in run.headers.values()) > 0


def test_a_full_disk_before_the_job_starts_leaves_it_untraced(tmp_path):
    with small_disk(tmp_path / "disk", "256k") as disk:
        (disk / "run" / "ranks").mkdir(parents=True)
        fd = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT)
        with contextlib.suppress(OSError):
            while True:
                os.write(fd, b"\0" * 4096)
        os.close(fd)
        res = run_cli(["run", "--nproc", "2", "--run-dir", str(disk / "run"), "--",
                       str(JOBS / "restarts" / "phase.py")], env={"PHASE_OPS": "20"})
        assert res.returncode == 0, res.stderr[-3000:]
        assert "Traceback" not in res.stderr
        assert "No space left" in res.stderr or "no space left" in res.stderr


def test_ranks_with_no_room_for_their_logs_are_said_untraced_by_rank(tmp_path):
    """Room for the run dir, none for the ranks' event logs: each rank said "tracing
    disabled on this rank" (which one, not said), and run ended on "no findings", as of a
    job diagnosed. Now each names its rank, and run's summary the ranks left untraced."""
    with small_disk(tmp_path / "disk", "256k") as disk:
        res = run_cli(["run", "--nproc", "2", "--run-dir", str(disk / "run"), "--",
                       str(JOBS / "restarts" / "phase.py")], env={"PHASE_OPS": "20"})
        assert res.returncode == 0, res.stderr[-3000:]
        assert "Traceback" not in res.stderr
        assert "tracing disabled on rank 0" in res.stderr, res.stderr[-3000:]
        assert "tracing disabled on rank 1" in res.stderr, res.stderr[-3000:]
        assert "rank(s) 0, 1 left no event log" in res.stderr, res.stderr[-3000:]


def test_a_run_dir_deleted_while_the_job_runs(tmp_path):
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        ["python", "-m", "distdoctor", "run", "--nproc", "2", "--run-dir", str(run_dir),
         "--", str(JOBS / "restarts" / "phase.py")], env=dict(os.environ, PHASE_OPS="4000"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
        start_new_session=True)
    try:
        for _ in range(200):
            if list((run_dir / "ranks").glob("rank-*.ring")) if run_dir.exists() else []:
                break
            subprocess.run(["sleep", "0.1"])
        shutil.rmtree(run_dir, ignore_errors=True)
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
    assert proc.returncode == 0, err.decode()[-3000:]
    assert b"Traceback" not in err
