"""`distdoctor check` stopped by SIGTERM (a scheduler's cancel): its ranks, its launcher and
every folder of theirs go with it, wherever the signal lands: in torchrun's rendezvous,
amid the check's own cleanup, or on a launcher slow to end."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from checkruns import _env
from conftest import live_processes

from distdoctor.launch.env import free_port


@pytest.mark.timeout(120)
def test_sigterm_stops_the_checks_ranks_and_removes_their_folder(tmp_path):
    """A two-node check cancelled on the node that waits for the other (a scheduler's
    SIGTERM): torchrun and its folder went with it. Before, the check ended alone and
    torchrun waited on in its own session, its folder left in the temp dir; and a check
    that stopped torchrun did it with SIGKILL, which left torchrun's own folder."""
    import signal
    import time

    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    port = free_port()
    # torchrun, in the rendezvous; the signal well inside it
    proc, out, err, waiting = _check_stopped_by_sigterm(
        ["torchrun", "--nnodes", "2", "--node-rank", "0", "--nproc-per-node", "1",
         "--master-addr", "127.0.0.1", "--master-port", str(port), "train.py"], tmpdir,
        lambda pid: [p for p in _with_tmpdir(tmpdir) if p != pid], 60, settle_s=1)
    assert proc.returncode == 128 + signal.SIGTERM, (out, err)
    assert not list(tmpdir.iterdir())  # its folder, and torchrun's own (torchelastic_*)
    time.sleep(0.5)
    assert not set(waiting) & set(_with_tmpdir(tmpdir)), waiting
    assert "Traceback" not in err, err


def _check_stopped_by_sigterm(cmd: list[str], tmpdir: Path, ready, within_s: float,
                              settle_s: float = 0.0):
    """`distdoctor check --no-sweep -- CMD` with TMPDIR=tmpdir, sent SIGTERM once `ready(its
    pid)` gives something (and `settle_s` after): (the process, its output, its error
    output, what `ready` gave). Killed if it outlives the test."""
    import signal
    import time

    proc = subprocess.Popen([sys.executable, "-m", "distdoctor", "check", "--no-sweep", "--",
                             *cmd], env=_env(TMPDIR=str(tmpdir)), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline, got = time.monotonic() + within_s, None
        while not got:
            assert proc.poll() is None and time.monotonic() < deadline, (
                "never ready", proc.poll())
            time.sleep(0.1)
            got = ready(proc.pid)
        time.sleep(settle_s)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc, out, err, got


def _with_tmpdir(tmpdir: Path) -> list[int]:
    """Live processes (zombies left out) whose environment has TMPDIR=tmpdir, or a folder
    inside it (the check's launcher has one in the check's folder)."""
    entry, inside = f"TMPDIR={tmpdir}".encode(), f"TMPDIR={tmpdir}/".encode()
    return [pid for pid, env, _ in live_processes()
            if any(v == entry or v.startswith(inside) for v in env.split(b"\0"))]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("event, which, args", [
    ("os.killpg", "True", ["--nproc", "2", "--timeout", "1"]),  # the ranks' stop (hung)
    ("shutil.rmtree", "'distdoctor-check-' in str(args[0])", ["--nproc", "1"]),  # folder
])
def test_sigterm_amid_the_checks_cleanup_finishes_it(tmp_path, event, which, args):
    """The signal lands as the cleanup starts: it cut the cleanup short, and the ranks
    after the one being stopped ran on (in their own sessions), or the rest of the folder
    stayed in the temp dir."""
    import signal

    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    code = ("import os, runpy, signal, sys\n"
            "def hook(event, args):\n"
            f"    if event == {event!r} and {which}:\n"
            "        os.kill(os.getpid(), signal.SIGTERM)\n"
            "sys.addaudithook(hook)\n"
            "sys.argv = ['distdoctor', 'check', '--no-sweep', *sys.argv[1:]]\n"
            "runpy.run_module('distdoctor', run_name='__main__')\n")
    try:
        r = subprocess.run([sys.executable, "-c", code, *args], capture_output=True,
                           text=True, env=_env(TMPDIR=str(tmpdir)),
                           stdin=subprocess.DEVNULL, timeout=90)
    finally:
        left = _with_tmpdir(tmpdir)
        for pid in left:  # (never past the test, whatever it finds)
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
    assert r.returncode == 128 + signal.SIGTERM, (r.stdout, r.stderr)
    assert not left, left
    assert not list(tmpdir.glob("distdoctor-check-*"))
    assert "Traceback" not in r.stderr, r.stderr


@pytest.mark.timeout(60)
def test_a_launcher_slow_to_end_leaves_no_folder_in_the_temp_dir(tmp_path):
    """A torchrun that does not end within the stop's grace (killed, it cannot remove its
    torchelastic_* folder): its temp dirs were in the user's temp dir, left there; now in
    the check's folder, removed with it."""
    import signal

    tmpdir, bin_dir = tmp_path / "tmp", tmp_path / "bin"
    tmpdir.mkdir()
    bin_dir.mkdir()
    torchrun = bin_dir / "torchrun"  # makes its folder, then ignores SIGTERM
    torchrun.write_text(
        f"#!{sys.executable}\nimport os, signal, tempfile, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "tempfile.mkdtemp(prefix='torchelastic_')\nprint('up', flush=True)\ntime.sleep(60)\n")
    torchrun.chmod(0o755)
    proc, out, err, _ = _check_stopped_by_sigterm(
        [str(torchrun), "--nproc-per-node", "1", "train.py"], tmpdir,
        lambda pid: list(tmpdir.rglob("torchelastic_*")), 30)
    assert proc.returncode == 128 + signal.SIGTERM, (out, err)
    assert not list(tmpdir.iterdir()), list(tmpdir.rglob("*"))
