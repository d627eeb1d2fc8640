"""The stack-dump registry under a shared temp dir, attacked for real.

A rank registers its in-process stack dump in `TMPDIR/distdoctor-stacks-<uid>/<pid>.json`.
Another local user who makes that directory first (or a link in its place, or leaves it
writable by all) must not get a rank, often root, to write through a link of theirs: the
directory is refused with one line, the fallback is off, and the job runs on.

Each case starts a real process that installs the handler as a rank does
(`install_stack_dump_handler`, called by the tracer at start-up), and asks for its stacks
as `distdoctor run` does (`dump_stacks`, which signals the rank). TMPDIR points at a
sticky, world-writable dir of the test's own, so the real /tmp is left alone.
"""

from __future__ import annotations

import contextlib
import os
import select
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from distdoctor.probes import stacks

from distdoctor.privatefiles import PrivateDir, read_regular

NOBODY = 65534
RANK = """
import sys, time
from distdoctor.probes.stacks import install_stack_dump_handler
sys.stdin.readline()  # the test plants its links once it knows our pid
ok = install_stack_dump_handler(sys.argv[1])
print("ready", ok, flush=True)
while True:
    time.sleep(0.05)
"""
PRECIOUS = b"the job's own file, which no stack dump may overwrite\n"


@pytest.fixture
def shared(tmp_path, monkeypatch) -> Path:
    """A /tmp of our own: sticky and world-writable, as the real one is."""
    d = tmp_path / "shared-tmp"
    d.mkdir()
    d.chmod(0o1777)
    monkeypatch.setenv("TMPDIR", str(d))
    monkeypatch.setattr(tempfile, "tempdir", str(d))  # this process's dump_stacks too
    return d


def _registry(shared: Path) -> Path:
    return shared / f"distdoctor-stacks-{os.geteuid()}"


@contextlib.contextmanager
def rank_process(tmp_path: Path, plant=lambda pid: None):
    """A process that installs the stack-dump handler after `plant(pid)` has run."""
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "stacks.txt")],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        plant(proc.pid)
        proc.stdin.write("go\n")
        proc.stdin.flush()
        ready, _, _ = select.select([proc.stdout], [], [], 30)
        assert ready, "the rank process did not start"
        proc.ready_line = proc.stdout.readline().strip()
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        _, proc.err = proc.communicate(timeout=10)


def _refused(proc, *words: str) -> None:
    """The rank said it once, in one line, with no traceback, and runs on."""
    lines = [ln for ln in proc.err.splitlines() if "stack dumps by signal are off" in ln]
    assert len(lines) == 1, proc.err
    assert all(w in lines[0] for w in words), lines[0]
    assert "Traceback" not in proc.err, proc.err
    assert proc.ready_line == "ready False", proc.ready_line


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                    reason="making a directory as another user needs root")
@pytest.mark.timeout(60)
def test_a_registry_made_by_another_user_with_a_link_per_pid_is_refused(tmp_path, shared):
    target = tmp_path / "victim.conf"
    target.write_bytes(PRECIOUS)
    reg = _registry(shared)
    reg.mkdir(mode=0o755)  # as `nobody` would make it, before any job ran
    os.chown(reg, NOBODY, NOBODY)

    def plant(pid: int) -> None:
        link = reg / f"{pid}.json"
        link.symlink_to(target)
        os.chown(link, NOBODY, NOBODY, follow_symlinks=False)

    with rank_process(tmp_path, plant) as proc:
        dump = stacks.dump_stacks({0: proc.pid}, timeout_s=3, use_py_spy=False)[0]
        assert proc.poll() is None, "the stack request killed the rank"
    assert target.read_bytes() == PRECIOUS
    assert dump.method == stacks.UNAVAILABLE
    _refused(proc, str(reg), f"uid {NOBODY}")


@pytest.mark.timeout(60)
def test_a_registry_that_is_a_link_is_refused(tmp_path, shared):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)  # ours and private: only the link is wrong
    _registry(shared).symlink_to(elsewhere)
    with rank_process(tmp_path) as proc:
        dump = stacks.dump_stacks({0: proc.pid}, timeout_s=3, use_py_spy=False)[0]
    assert list(elsewhere.iterdir()) == []
    assert dump.method == stacks.UNAVAILABLE
    _refused(proc, "symbolic link")


@pytest.mark.timeout(60)
def test_a_registry_others_can_write_is_refused(tmp_path, shared):
    reg = _registry(shared)
    reg.mkdir()
    reg.chmod(0o777)
    with rank_process(tmp_path) as proc:
        dump = stacks.dump_stacks({0: proc.pid}, timeout_s=3, use_py_spy=False)[0]
    assert list(reg.iterdir()) == []
    assert dump.method == stacks.UNAVAILABLE
    _refused(proc, "0777")


@pytest.mark.timeout(60)
def test_a_fresh_registry_is_private_and_the_dump_works(tmp_path, shared):
    with rank_process(tmp_path) as proc:
        assert proc.ready_line == "ready True"
        reg = _registry(shared)
        assert stat.S_IMODE(reg.lstat().st_mode) == 0o700
        assert stat.S_IMODE((reg / f"{proc.pid}.json").lstat().st_mode) == 0o600
        dump = stacks.dump_stacks({0: proc.pid}, timeout_s=10, use_py_spy=False)[0]
    assert dump.method == stacks.SIGNAL and "rank.py" in dump.text, dump
    assert "stack dumps by signal are off" not in proc.err


def test_files_in_a_private_dir_replace_links_and_never_read_through_them(tmp_path):
    target = tmp_path / "target"
    target.write_bytes(PRECIOUS)
    d = tmp_path / "private"
    with PrivateDir.open(str(d)) as private:
        (d / "a.json").symlink_to(target)
        with pytest.raises(OSError):
            private.read("a.json")
        private.write("a.json", b"{}")
        assert private.read("a.json") == b"{}"
        with pytest.raises(ValueError):
            private.write("../escape", b"x")
    assert target.read_bytes() == PRECIOUS
    assert not (d / "a.json").is_symlink()
    assert [p.name for p in d.iterdir()] == ["a.json"]  # no temp file left


def test_read_regular_reads_no_link_no_fifo_and_nothing_over_its_bound(tmp_path):
    """The one reader of the kept sources, their manifest and the collector's copies: a
    link planted at the name is not followed, a FIFO is not waited on (a reader blocked
    on it would hang `diagnose`), and a file over the bound is refused whole."""
    secret = tmp_path / "secret"
    secret.write_bytes(b"another user's file")
    (tmp_path / "plain").write_bytes(b"x" * 10)
    (tmp_path / "link").symlink_to(secret)
    os.mkfifo(tmp_path / "fifo")
    assert read_regular(tmp_path / "plain", 10) == b"x" * 10
    assert read_regular(tmp_path / "plain", 9) is None
    assert read_regular(tmp_path / "link", 100) is None
    assert read_regular(tmp_path / "fifo", 100) is None
    assert read_regular(tmp_path / "missing", 100) is None
    assert read_regular(tmp_path, 100) is None  # a directory
