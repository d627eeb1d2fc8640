"""What the world does to distdoctor's files while a job runs: a full disk, a run dir
deleted. The job's outcome must be what it would be without distdoctor, and distdoctor
says what it lost in one line."""

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys

import pytest
from conftest import JOBS, run_cli, small_disk

from distdoctor.runlog.run import read_incarnations
from distdoctor.runlog.slots import native_module

# a store into a shrunk log is caught by the C extension's fault handler (shrink.py)
needs_native = pytest.mark.skipif(native_module() is None, reason="C extension not built")

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


@needs_native
def test_a_log_shrunk_by_another_process_costs_its_events_not_the_rank(tmp_path):
    """Each rank's log truncated mid-job by another process (to 0, to half): the next
    store into its map was SIGBUS and killed the rank. The rank goes on, its log ends
    there, it says so in one line, and the readers refuse that log in one line."""
    run_dir = tmp_path / "run"
    res = run_cli(["run", "--nproc", "2", "--run-dir", str(run_dir), "--",
                   str(CHAOS / "log_shrunk.py")], env={"DISTDOCTOR_RING_MIB": "0.25"},
                  run_dir=run_dir, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "rank 0 done: 1200.0" in res.stdout and "rank 1 done: 1200.0" in res.stdout
    assert res.stderr.count("was shrunk by something other than distdoctor") == 2, res.stderr
    assert "SIGBUS" not in res.stderr and "Traceback" not in res.stderr
    for cmd in (["diagnose", str(run_dir)], ["watch", str(run_dir), "--once"]):
        out = run_cli(cmd)
        assert out.returncode in (0, 1) and "Traceback" not in out.stderr, (cmd, out.stderr)
        assert "truncated" in out.stdout + out.stderr, cmd


_SHRINK_THEN_STORE = """
import os, sys
from distdoctor.runlog.ring import RingWriter
w = RingWriter(sys.argv[1], 0, 64 * 128, 4096)
os.truncate(sys.argv[1], 0)
if sys.argv[2] == "look":
    assert not w.whole()  # the heartbeat's and the exit marks' look first
for i in range(100):
    w.append(1, 1, 0, 0, 0, 0, i, -1, 0, 1, 1, 5, 0, 0)
w.add_string({"k": "v"})
w.heartbeat()
w.mark_closed()
w.close()
if sys.argv[2] == "kill":
    os.kill(os.getpid(), 7)  # SIGBUS not ours: the default action, as without distdoctor
if sys.argv[2] == "other":  # the job's own map of a file shrunk: its fault is its own
    import mmap
    with open(sys.argv[1] + ".own", "w+b") as f:
        f.truncate(8192)
        own = mmap.mmap(f.fileno(), 8192)
        f.truncate(0)
        own[4096] = 1
print("alive")
"""


_COPY_SHRUNK = """
import os, sys
from distdoctor.runlog.ring import RingWriter
from distdoctor.runlog.ring_copy import open_copy
RingWriter(sys.argv[1], 0, 64 * 128, 4096).close()
copy = open_copy(sys.argv[1])  # a collector's copy of another host's log
copy.put_slot(0, bytes(128))  # (the whole small file reserved: no later fallocate)
os.truncate(sys.argv[1], 0)
for e in range(1, 64):
    copy.put_slot(e, bytes(128))
copy.put_state(64, 0, 0, 0, 1, 1, 0)
copy.close()
print("alive")
"""


@pytest.mark.parametrize("how", ["store", "look", "pure", "other", "kill", "copy"])
def test_stores_into_a_shrunk_log_never_kill_the_writer(tmp_path, how):
    """store: straight after the shrink, through the C writer (the fault is caught);
    look: after the writer looked (the map swapped first); pure: the Python writer, which
    looks too; other, kill: a SIGBUS of the job's own (a fault in its own map, a kill)
    still ends the process as it would have without distdoctor; copy: the collector's
    copy of a log, shrunk under it (the fault is caught)."""
    if how in ("store", "copy") and native_module() is None:
        pytest.skip("C extension not built")
    env = dict(os.environ, DISTDOCTOR_PURE_PYTHON="1" if how == "pure" else "0")
    res = subprocess.run([sys.executable, "-c",
                          _COPY_SHRUNK if how == "copy" else _SHRINK_THEN_STORE,
                          str(tmp_path / "rank-00000.ring"), "look" if how == "pure" else how],
                         env=env, capture_output=True, text=True, timeout=60)
    if how in ("other", "kill"):
        assert res.returncode == -signal.SIGBUS, (res.returncode, res.stderr)
    else:
        assert (res.returncode, res.stdout) == (0, "alive\n"), (res.returncode, res.stderr)
