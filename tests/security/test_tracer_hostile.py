"""Odd but legitimate programs under the tracer: the job must run as it runs bare, to the
same results and exit, with nothing of distdoctor's in its way (no hang, no exception,
no descriptor or thread it keeps).

Real jobs: `distdoctor run --nproc 2` on gloo; the jobs are in tests/jobs/odd_programs/."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
import warnings

import pytest
from conftest import run_cli, run_job

from distdoctor.runlog.ring import RingWriter
from distdoctor.runlog.run import read_incarnations
from distdoctor.tracer.recorder import Recorder

ODD = "odd_programs"


@pytest.mark.timeout(120)
def test_a_process_that_makes_its_group_again_and_again_keeps_nothing_of_the_old(tmp_path):
    """Each default group made again kept 7 descriptors and a thread: the C path's last
    waited work (and with it the old group's gloo context: a socket, an epoll, a pipe
    pair, a thread), the log's map and descriptors, the sampler's schedstat. A test
    suite's fixture or a sweep in one process ran out of descriptors at ~145 groups
    under `ulimit -n 1024`."""
    res = run_job(f"{ODD}/remake_group_often.py", 2, tmp_path / "run", "30", timeout=100)
    assert res.returncode == 0, res.stderr[-3000:]
    held = {(int(r), int(n)): (int(fds), int(threads)) for r, n, fds, threads in re.findall(
        r"rank (\d) after (\d+) groups: (\d+) descriptors, (\d+) threads", res.stdout)}
    assert sorted(held) == [(0, 5), (0, 30), (1, 5), (1, 30)], res.stdout
    for rank in (0, 1):
        assert held[rank, 30] == held[rank, 5], held
    assert "Traceback" not in res.stderr and "distdoctor:" not in res.stdout


@pytest.mark.timeout(120)
def test_a_rank_without_the_run_dir_in_its_environment_joins_the_others(tmp_path):
    """Rank 0 had the run dir from `run` and kept it to itself: the rank without it waited
    10 s on the store for rank 0's word, then traced into a run dir of its own (run said '1
    rank(s) traced')."""
    res = run_job(f"{ODD}/rank_without_run_dir_env.py", 2, tmp_path / "run", timeout=100)
    assert res.returncode == 0, res.stderr[-3000:]
    for rank in (0, 1):
        assert f"rank {rank}: sum 32" in res.stdout, res.stdout[-2000:]
    assert "2 rank(s) traced" in res.stderr, res.stderr[-2000:]
    assert sorted(p.name for p in (tmp_path / "run" / "ranks").glob("*.ring")) == [
        "rank-00000.ring", "rank-00001.ring"]


@pytest.mark.timeout(120)
def test_a_signal_handler_that_issues_a_collective_never_waits_on_the_tracer(tmp_path):
    """A handler runs between two bytecodes of distdoctor's own code too: one that issued
    an op while the rank was inside the string table's lock waited on it for ever (the
    rank hung within a second; bare, 3,000 ops in under a second)."""
    res = run_job(f"{ODD}/collective_in_signal_handler.py", 2, tmp_path / "run", "3000",
                  timeout=100)
    assert res.returncode == 0, res.stderr[-3000:]
    for rank in (0, 1):
        assert (f"rank {rank}: 3000 all_reduces, sum of firsts 6000, the handler's some"
                in res.stdout), res.stdout[-2000:] + res.stderr[-2000:]
    assert "Traceback" not in res.stderr


@pytest.mark.timeout(120)
def test_a_thread_that_ends_itself_with_sys_exit_is_not_a_crash(tmp_path):
    """sys.exit on a worker thread ends that thread: the job went on and exited 0, and
    every rank was named a crash "with code 3 through sys.exit" at the thread's line."""
    run_dir = tmp_path / "run"
    res = run_job(f"{ODD}/thread_sys_exit.py", 2, run_dir)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.count("[1048576.0, 1048576.0]") == 2, res.stdout
    assert "CRASH" not in res.stderr, res.stderr[-3000:]
    diag = run_cli(["diagnose", str(run_dir), "--json"])
    assert json.loads(diag.stdout)["findings"] == [], diag.stdout[-3000:]


@pytest.mark.timeout(120)
def test_a_barrier_that_fails_raises_with_no_frame_of_distdoctor(tmp_path):
    """A peer that dies fails the others' barrier: the traceback the job prints named
    distdoctor/tracer/process_group.py (the recorder waited there), as if distdoctor had
    failed; now it is torch's own, as bare, and the failure is still in the log."""
    run_dir = tmp_path / "run"
    res = run_job(f"{ODD}/peer_dies_in_barrier.py", 2, run_dir)
    assert res.returncode != 0
    assert "Connection closed by peer" in res.stderr, res.stderr[-3000:]
    frames = [line for line in res.stderr.splitlines() if 'File "' in line]
    assert any("distributed_c10d.py" in line and "in barrier" in line for line in frames)
    assert not [line for line in frames if f"{os.sep}distdoctor{os.sep}" in line], frames
    barrier = [e for e in read_incarnations(run_dir)[0].events[0] if e.op == "barrier"]
    assert [e.status for e in barrier] == ["error"], barrier


@pytest.mark.timeout(120)
@pytest.mark.parametrize("named", ["", "named"])
def test_collectives_run_through_exec_of_a_string_leave_no_memory_behind(tmp_path, named):
    """Each exec() compiles new code, met by the call-site walk: every such code object
    was kept for good (18,000 ops: 14 MB a rank; bare: 0). Compiled under the file's own
    name, each was a new call site too: its code, key and string kept (10,000: 13 MB)."""
    res = run_job(f"{ODD}/eval_collectives.py", 2, tmp_path / "run", "12000", named,
                  timeout=100)
    assert res.returncode == 0, res.stderr[-3000:]
    grew = [int(kb) for kb in re.findall(r"anonymous memory grew (-?\d+) kB", res.stdout)]
    assert len(grew) == 2 and max(grew) < 1024, res.stdout


@pytest.mark.timeout(60)
def test_a_forked_child_ends_whatever_lock_a_tracer_thread_held_at_the_fork(tmp_path):
    """A rank's child forked with os.fork that ends through sys.exit runs the recorder's
    exit hook, which set the parent's events. The sampler holds one's lock for a moment,
    50 times a second: a child forked then waited on it for ever at exit (2 ranks forking
    with the sampler at 100,000 Hz: 1 child in 150 hung in Recorder.retire, Event.set).
    Here the moment is made certain: a thread holds the lock across the fork."""
    rec = Recorder(RingWriter(str(tmp_path / "rank-0.ring"), 0, 1 << 16, 1 << 14))
    held, forked = threading.Event(), threading.Event()

    def hold() -> None:
        with rec._stop._cond:  # where the sampler's Event.wait holds it
            held.set()
            forked.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    assert held.wait(10)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads (3.12+)
        pid = os.fork()
    if pid == 0:
        try:
            rec.close()  # what its atexit hook runs
        finally:
            os._exit(0)
    forked.set()
    holder.join()
    deadline = time.monotonic() + 10
    while (ended := os.waitpid(pid, os.WNOHANG)[0]) == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    if not ended:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    rec.close()
    assert ended == pid, "the forked child did not end"
