"""Shared helpers: run real multi-process jobs under `distdoctor run`, with hard timeouts.

A job that outlives its timeout is stopped (distdoctor run gets SIGTERM and stops its
ranks; anything left, found through the rank pids in the run dir, is SIGKILLed), so a
hanging test fails fast and leaves no processes behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from tiers import EXTENDED, MATRIX_SMOKE

JOBS = Path(__file__).parent / "jobs"


def _kill_ranks(run_dir: Path) -> None:
    for meta in (run_dir / "ranks").glob("rank-*.json"):
        try:
            os.kill(json.loads(meta.read_text())["pid"], signal.SIGKILL)
        except (OSError, ValueError, KeyError):
            pass


def live_processes():
    """(pid, environment bytes, command line bytes) of every live process but this one
    (zombies left out): what the clean-up tests search for their job's leftovers."""
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                    continue
            with open(f"/proc/{name}/environ", "rb") as f:
                env = f.read()
            with open(f"/proc/{name}/cmdline", "rb") as f:
                argv = f.read()
        except (OSError, IndexError):
            continue
        yield int(name), env, argv


def run_cli(args: list[str], timeout: float = 120, env: dict | None = None,
            run_dir: Path | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """`python -m distdoctor ARGS` with a hard timeout and full clean-up."""
    full_env = dict(os.environ, **(env or {}))
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    proc = subprocess.Popen([sys.executable, "-m", "distdoctor", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            env=full_env, cwd=cwd, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
        if run_dir is not None:
            _kill_ranks(run_dir)
        pytest.fail(f"distdoctor {' '.join(args)} timed out after {timeout}s\n{_text(out)}\n{_text(err)}")
    finally:
        if run_dir is not None and proc.returncode is not None:
            _kill_ranks(run_dir)
    # decoded by hand: text mode would turn a job's `\r` into `\n`
    return subprocess.CompletedProcess(proc.args, proc.returncode, _text(out), _text(err))


def run_ranks_bare(argv: list[str], env: dict, nproc: int, timeout: float,
                   what: str) -> list[str]:
    """`argv` as `nproc` ranks launched torchrun-style without distdoctor (the bare twin
    of a traced run), each in a session of its own; every one killed on a timeout. Each
    rank's output; every rank must exit 0."""
    from distdoctor.launch.env import free_port, rank_env

    port = free_port()
    procs = [subprocess.Popen(argv, env=rank_env(env, r, nproc, port),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              stdin=subprocess.DEVNULL, text=True, start_new_session=True)
             for r in range(nproc)]
    try:
        outputs = [p.communicate(timeout=timeout)[0] for p in procs]
    except subprocess.TimeoutExpired:
        pytest.fail(f"{what} did not finish in {timeout}s")
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    assert all(p.returncode == 0 for p in procs), "\n".join(o[-4000:] for o in outputs)
    return outputs


def _text(data: bytes | None) -> str:
    return (data or b"").decode("utf-8", "replace")


def run_job(job: str, nproc: int, run_dir: Path, *job_args: str, timeout: float = 120,
            env: dict | None = None) -> subprocess.CompletedProcess:
    """Run tests/jobs/JOB under `distdoctor run --nproc N`."""
    return run_cli(["run", "--nproc", str(nproc), "--run-dir", str(run_dir), "--grace", "2",
                    "--", str(JOBS / job), *job_args],
                   timeout=timeout, env=env, run_dir=run_dir)


def marker_sets(path: Path) -> dict[str, set[int]]:
    """`# expect: NAME` comments in a job file -> every line that carries each name."""
    out: dict[str, set[int]] = {}
    for no, text in enumerate(Path(path).read_text().splitlines(), start=1):
        if "# expect:" in text:
            out.setdefault(text.split("# expect:")[1].strip(), set()).add(no)
    return out


def marker_lines(job: str, jobs: Path = JOBS) -> dict[str, int]:
    """`# expect: NAME` comments in a job file (under `jobs`) -> their line numbers."""
    lines = {}
    for no, text in enumerate((jobs / job).read_text().splitlines(), start=1):
        if "# expect:" in text:
            lines[text.split("# expect:")[1].strip()] = no
    return lines


def own_sites(finding: dict) -> dict[int, dict]:
    """Each rank's own call site in a finding: its first entry that is not a line that
    called it (`"role": "caller"`, listed after it)."""
    sites: dict[int, dict] = {}
    for c in finding["callsites"]:
        if c.get("role") != "caller":
            sites.setdefault(c["rank"], c)
    return sites


def start_cli(args: list[str], env: dict | None = None) -> subprocess.Popen:
    """`python -m distdoctor ARGS` in the background, in its own session (stop_process)."""
    return subprocess.Popen([sys.executable, "-m", "distdoctor", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, start_new_session=True,
                            env=dict(os.environ, PYTHONUNBUFFERED="1", **(env or {})))


class Lines:
    """A process's stderr, line by line, read in a thread (never blocks the test)."""

    def __init__(self, proc: subprocess.Popen):
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(proc.stderr,), daemon=True)
        self._thread.start()

    def _read(self, stream) -> None:
        for raw in stream:
            self.lines.append(raw.decode(errors="replace"))

    def wait_for(self, text: str, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if text in line:
                    return line
            time.sleep(0.1)
        raise AssertionError(f"no line with {text!r} within {timeout_s} s:\n"
                             + "".join(self.lines))


def stop_process(proc: subprocess.Popen, sig=signal.SIGTERM, timeout_s: float = 30) -> int:
    """Signal it, wait, and SIGKILL its whole session if it does not end."""
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        return proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return proc.wait()


@contextlib.contextmanager
def small_disk(path, size: str):
    """A tmpfs of `size` at `path` (root only: skipped where mounting is not allowed)."""
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small file system here: {done.stderr.strip()}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def pytest_configure(config):
    config.addinivalue_line("markers", "matrix: the smoke set run on every torch of the matrix")
    config.addinivalue_line("markers", "extended: variants outside CI's default run (EXTENDED)")
    _compile_once()


def _compile_once() -> None:
    """Byte-compile distdoctor and the test jobs' modules before any job starts. Every rank,
    launcher and CLI process of the suite imports them; where PYTHONDONTWRITEBYTECODE is set
    (as on our machines) none of them writes a cache, and each compiled distdoctor's source
    anew: about 1 s of CPU per 4-rank job here. compileall writes the caches regardless and
    skips what is current."""
    import compileall
    root = Path(__file__).parent.parent
    for tree in (root / "distdoctor", root / "tests"):
        compileall.compile_dir(str(tree), quiet=1)


def pytest_collection_modifyitems(config, items):
    for item in items:
        node = item.nodeid.split("tests/", 1)[-1]
        if node.startswith(MATRIX_SMOKE):
            item.add_marker(pytest.mark.matrix)
        if node.startswith(EXTENDED):
            item.add_marker(pytest.mark.extended)
    if "extended" not in (config.option.markexpr or ""):  # not asked for: left out
        kept = [i for i in items if i.get_closest_marker("extended") is None]
        if len(kept) < len(items):
            config.hook.pytest_deselected(
                items=[i for i in items if i.get_closest_marker("extended") is not None])
            items[:] = kept


@pytest.fixture(scope="session")
def tls_certs(tmp_path_factory):
    """A CA, the collector's and a node's certificates, and a CA nobody trusts
    (tests/tlscerts.py), made with the openssl CLI once per session."""
    import tlscerts

    return tlscerts.make(tmp_path_factory.mktemp("tls"))
