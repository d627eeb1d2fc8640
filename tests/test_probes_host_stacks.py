"""Host and stack probes, for real: psutil on live and killed processes, py-spy on a stuck
process, and the signal-triggered in-process fallback. Every child is killed and reaped."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from distdoctor.probes.host import HostProbe, process_alive
from distdoctor.probes.stacks import dump_stacks, find_py_spy, install_stack_dump_handler

STUCK = """
import signal, sys, threading, time
from distdoctor.probes.stacks import install_stack_dump_handler, keep_stack_dump_handler
mode = sys.argv[1]
if mode == "own-handler":
    signal.signal(signal.SIGUSR2, lambda *a: print("user handler ran", flush=True))
ok = install_stack_dump_handler(sys.argv[2]) if mode != "no-handler" else False
if mode == "takes-it-later":  # the job's own handler, set after distdoctor's (a trainer's
    # preemption handler), then the tracer's heartbeat looks
    signal.signal(signal.SIGUSR2, lambda *a: print("user handler ran", flush=True))
    keep_stack_dump_handler()

def churn(n):  # deep calls: frames made and freed all the time
    return 0 if n == 0 else churn(n - 1) + 1

def churning():
    while True:
        churn(800)

if mode == "churning":  # threads that run while the main thread waits with the GIL released
    for _ in range(2):
        threading.Thread(target=churning, daemon=True).start()

def stuck_in_compute():
    print("ready", ok, flush=True)  # inside: a dump from now on shows this function
    while True:
        time.sleep(0.05)

stuck_in_compute()
"""


@contextlib.contextmanager
def child(tmp_path: Path, mode: str = "handler"):
    script = tmp_path / "stuck.py"
    script.write_text(STUCK)
    proc = subprocess.Popen([sys.executable, str(script), mode, str(tmp_path / "stacks.txt")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL)
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 30)
        assert ready, "child did not start"
        proc.ready_line = proc.stdout.readline().strip()
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=10)


def test_host_snapshot_reads_this_machine():
    s = HostProbe().host_snapshot()
    assert s.cpu_count and s.cpu_count >= 1
    assert s.mem_total_bytes > s.mem_available_bytes > 0
    assert s.load1 is not None and s.net_sent_bytes is not None


def test_the_first_reading_in_the_samplers_thread_covers_the_time_since_the_probe():
    """The probe is made in run's main thread and read in the sampler's: its first CPU
    reading covers the time between (psutil's per-thread priming made it one of two
    back-to-back reads of the same counters: 0.0)."""
    import threading

    probe = HostProbe()
    end = time.process_time() + 0.3
    while time.process_time() < end:  # a core's worth of CPU since the probe was made
        pass
    got = []
    reader = threading.Thread(target=lambda: got.append(probe.host_snapshot().cpu_pct))
    reader.start()
    reader.join()
    assert got[0] >= 50 / (os.cpu_count() or 1)


def test_the_files_kept_of_a_ranks_threads_go_with_the_threads_and_the_rank():
    """The run queue of a rank's threads is read from files kept open between ticks: a
    thread that ends, a rank that leaves, and the probe's close leave none open."""
    code = ("import threading, time\n"
            "for _ in range(6): threading.Thread(target=time.sleep, args=(0.4,)).start()\n"
            "print('up', flush=True); time.sleep(60)")
    rank = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert rank.stdout.readline().strip() == "up"
        def open_fds() -> int:
            return len(os.listdir("/proc/self/fd"))

        probe, before = HostProbe(), open_fds()
        probe.processes({0: rank.pid})
        assert open_fds() == before + 7  # its main thread's and the six others'
        deadline = time.monotonic() + 10
        while len(os.listdir(f"/proc/{rank.pid}/task")) > 1 and time.monotonic() < deadline:
            time.sleep(0.05)  # the six end
        snap = probe.processes({0: rank.pid})[0]
        assert open_fds() == before + 1 and snap.runq_ms_per_s is not None
        assert probe.processes({}) == () and open_fds() == before
        probe.processes({0: rank.pid})
        probe.close()
        assert open_fds() == before
    finally:
        rank.kill()
        rank.wait()


def test_process_liveness_of_a_killed_rank(tmp_path):
    probe = HostProbe()
    with child(tmp_path, "no-handler") as proc:
        snap = probe.processes({3: proc.pid})[0]
        assert (snap.rank, snap.pid, snap.alive) == (3, proc.pid, True)
        assert snap.status in ("sleeping", "running") and snap.rss_bytes > 1 << 20
        time.sleep(0.2)
        assert probe.processes({3: proc.pid})[0].cpu_pct is not None  # second tick
        os.kill(proc.pid, signal.SIGSTOP)
        time.sleep(0.1)
        assert probe.processes({3: proc.pid})[0].status == "stopped"
        proc.kill()
        deadline = time.monotonic() + 10
        while probe.process_snapshot(3, proc.pid).status != "zombie":
            assert time.monotonic() < deadline
            time.sleep(0.02)
        snap = probe.process_snapshot(3, proc.pid)
        assert not snap.alive and not process_alive(proc.pid)  # dead, not yet reaped
        proc.wait(timeout=10)
        snap = probe.process_snapshot(3, proc.pid)
        assert (snap.alive, snap.status) == (False, "gone")


@pytest.mark.skipif(find_py_spy() is None, reason="py-spy is not installed")
def test_py_spy_names_the_function_a_rank_is_stuck_in(tmp_path):
    with child(tmp_path, "no-handler") as proc:
        dumps = dump_stacks({5: proc.pid}, timeout_s=30)
        d = dumps[5]
        assert d.method == "py-spy", d.error
        assert "stuck_in_compute" in d.text and "stuck.py" in d.text
        assert proc.poll() is None  # still running after the dump


def test_signal_fallback_when_py_spy_cannot_be_used(tmp_path):
    with child(tmp_path, "handler") as proc:
        assert proc.ready_line == "ready True"
        for kwargs in ({"use_py_spy": False},  # not installed
                       {"py_spy": "/nonexistent/py-spy"},  # cannot start
                       {"py_spy": "/bin/false"}):  # cannot attach (fails)
            d = dump_stacks({2: proc.pid}, timeout_s=20, **kwargs)[2]
            assert d.method == "signal", (kwargs, d.error)
            assert "stuck_in_compute" in d.text and 'stuck.py"' in d.text
            assert d.text.count("stuck_in_compute") == 1  # only the new dump, not the old
        assert proc.poll() is None  # the rank runs on


@pytest.mark.timeout(120)
def test_dumps_while_other_threads_run_never_crash_the_rank(tmp_path):
    """faulthandler dumped every thread from inside the signal handler, walking the frames
    of threads that ran meanwhile: with two threads making deep calls the rank died of
    SIGSEGV within a few dumps (as a job under distdoctor did once, its sampler thread
    running). The main thread's stack alone, dumped on that thread."""
    with child(tmp_path, "churning") as proc:
        assert proc.ready_line == "ready True"
        for i in range(20):
            d = dump_stacks({0: proc.pid}, timeout_s=20, use_py_spy=False)[0]
            assert proc.poll() is None, f"the rank died ({proc.returncode}) at dump {i}"
            assert d.method == "signal", (i, d.error)
            assert "stuck_in_compute" in d.text and "churn" not in d.text, d.text


def test_no_handler_no_py_spy_is_unavailable_and_never_signals(tmp_path):
    with child(tmp_path, "no-handler") as proc:
        d = dump_stacks({0: proc.pid}, timeout_s=5, use_py_spy=False)[0]
        assert d.method == "unavailable" and "no in-process stack-dump handler" in d.error
        time.sleep(0.2)
        assert proc.poll() is None  # SIGUSR2's default action would have killed it


def test_handler_leaves_a_jobs_own_sigusr2_alone(tmp_path):
    with child(tmp_path, "own-handler") as proc:
        assert proc.ready_line == "ready False"
        d = dump_stacks({0: proc.pid}, timeout_s=5, use_py_spy=False)[0]
        assert d.method == "unavailable"
        proc.kill()
        out, _ = proc.communicate(timeout=10)
        assert "user handler ran" not in out


def test_a_jobs_sigusr2_handler_set_later_is_never_sent_a_dump_request(tmp_path):
    """A job that takes SIGUSR2 after distdoctor armed its dump (a trainer's preemption
    handler that checkpoints and requeues) had that handler run by every stack dump `run`
    asked for; the heartbeat now gives the signal up to the job."""
    with child(tmp_path, "takes-it-later") as proc:
        assert proc.ready_line == "ready True"
        d = dump_stacks({0: proc.pid}, timeout_s=5, use_py_spy=False)[0]
        assert d.method == "unavailable", d
        time.sleep(0.3)
        proc.kill()
        out, _ = proc.communicate(timeout=10)
        assert "user handler ran" not in out


def test_dead_pid_is_unavailable_quickly():
    t0 = time.monotonic()
    d = dump_stacks({1: 2**22 + 12345}, timeout_s=5, py_spy="/bin/false")[1]
    assert d.method == "unavailable" and d.error
    assert time.monotonic() - t0 < 5


def test_install_is_safe_without_sigusr2(monkeypatch):
    monkeypatch.delattr(signal, "SIGUSR2")
    assert install_stack_dump_handler("/nonexistent/dir/x.txt") is False


def test_many_small_processes_of_one_program_are_one_busy_program():
    """Six processes of one program, each busy ~10% of the time: none is busy alone, the
    program is (its processes' CPU summed), and all of the others' CPU is counted."""
    from hogs import cpu_hogs

    probe = HostProbe()
    with cpu_hogs(["any"] * 6, duty=0.1, name="ddprobehog", detached=True) as hogs:
        time.sleep(0.5)
        probe.busy_others([])  # the first look: a rate needs two
        time.sleep(1.0)
        busy, others_pct = probe.busy_others([])
    mine = [b for b in busy if b["name"] == "ddprobehog"]
    assert len(mine) == 1, busy
    assert mine[0]["count"] == 6 and set(mine[0]["pids"]) == set(hogs), mine
    assert mine[0]["cpu_pct"] >= 20, mine  # ~60% of a core on an idle machine
    assert others_pct >= mine[0]["cpu_pct"]
