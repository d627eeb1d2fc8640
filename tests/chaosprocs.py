"""The processes a chaos test starts (test_chaos_*.py), and what it checks of what they
said. Real processes: gloo on CPU, 2 ranks.

Every process a test starts carries CHAOS_TAG=<a value of its own> in its environment (the
ranks, run's guardian, a forked child inherit it); whatever happens, each scenario ends by
SIGKILLing every live process that carries it or names its folder on its command line.
Every wait has its own deadline, well within pytest's timeout (whose thread method ends
pytest without running finalizers)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from conftest import JOBS, live_processes

from distdoctor.runlog.run import read_incarnations

CHAOS = JOBS / "chaos"
TAG = "CHAOS_TAG"
# every chaos test module's pytestmark: the clean-up finds processes through /proc
NEEDS_PROC = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc")


# --- processes ---------------------------------------------------------------------------

class Proc:
    """A process in a session of its own, no terminal, its stdout and stderr read line by
    line in threads (never blocks the test)."""

    def __init__(self, argv: list[str], env: dict):
        self.argv = argv
        self.popen = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, env=env, start_new_session=True)
        self.pid = self.popen.pid
        self._lines: dict[str, list[str]] = {"out": [], "err": []}
        self._readers = [threading.Thread(target=self._read, args=(stream, self._lines[name]),
                                          daemon=True)
                         for name, stream in (("out", self.popen.stdout),
                                              ("err", self.popen.stderr))]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _read(stream, lines: list[str]) -> None:
        for raw in iter(stream.readline, b""):
            lines.append(raw.decode(errors="replace"))

    @property
    def out(self) -> str:
        return "".join(self._lines["out"])

    @property
    def err(self) -> str:
        return "".join(self._lines["err"])

    def poll(self) -> int | None:
        return self.popen.poll()

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.popen.poll() is None:
            with contextlib.suppress(OSError):
                os.kill(self.pid, sig)

    def finish(self, timeout_s: float) -> int:
        """Its exit code, once it ended and its output is read (fails after timeout_s)."""
        try:
            code = self.popen.wait(timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{' '.join(map(str, self.argv))} still running after "
                                 f"{timeout_s} s\n{self.out[-2000:]}\n{self.err[-3000:]}"
                                 ) from None
        for reader in self._readers:  # a process it left behind may hold the pipes
            reader.join(10)
        return code

    def wait_for(self, text: str, timeout_s: float, stream: str = "err") -> str:
        deadline = time.monotonic() + timeout_s
        while True:
            for line in list(self._lines[stream]):
                if text in line:
                    return line
            if time.monotonic() > deadline or (
                    self.popen.poll() is not None
                    and not any(r.is_alive() for r in self._readers)):
                raise AssertionError(f"no line with {text!r} within {timeout_s} s from "
                                     f"{' '.join(map(str, self.argv))}:\n{self.out[-2000:]}"
                                     f"\n{self.err[-3000:]}")
            time.sleep(0.05)


class Procs:
    """What a scenario starts, all of it SIGKILLed by `cleanup`."""

    def __init__(self, base: Path):
        self.base = base
        self.tag = uuid.uuid4().hex
        self.started: list[Proc] = []

    def _env(self, extra: dict | None) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith("DISTDOCTOR_")}
        env.update(PYTHONUNBUFFERED="1", **{TAG: self.tag})
        env.update({k: str(v) for k, v in (extra or {}).items()})
        return env

    def distdoctor(self, *args, env: dict | None = None) -> Proc:
        return self.python("-m", "distdoctor", *args, env=env)

    def python(self, *args, env: dict | None = None) -> Proc:
        proc = Proc([sys.executable, *map(str, args)], self._env(env))
        self.started.append(proc)
        return proc

    def tagged(self) -> list[int]:
        """Live processes (not zombies) with our tag in their environment or our folder on
        their command line."""
        tag, folder = f"{TAG}={self.tag}".encode(), str(self.base).encode()
        return [pid for pid, env, argv in live_processes()
                if tag in env.split(b"\0") or folder in argv]

    def cleanup(self) -> None:
        for proc in self.started:
            if proc.poll() is None:
                with contextlib.suppress(OSError):
                    os.killpg(proc.pid, signal.SIGKILL)
        for _ in range(3):  # a process may fork while we look
            for pid in self.tagged():
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        for proc in self.started:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(10)


@contextlib.contextmanager
def chaos_procs(base: Path):
    procs = Procs(base)
    try:
        yield procs
    finally:
        procs.cleanup()


@pytest.fixture(name="procs")
def procs_fixture(tmp_path):
    """`procs` in a test: what it starts, SIGKILLed at its end. Imported by the modules
    whose tests take it (named apart so that the parameter does not shadow the import)."""
    with chaos_procs(tmp_path) as p:
        yield p


# --- helpers -----------------------------------------------------------------------------

def _until(predicate, timeout_s: float, what: str, proc: Proc | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s} s"
                                 + (f"\n{proc.out[-2000:]}\n{proc.err[-3000:]}" if proc else ""))
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"{what}: {' '.join(proc.argv)} ended ({proc.poll()}) first"
                                 f"\n{proc.out[-2000:]}\n{proc.err[-3000:]}")
        time.sleep(0.02)


def _no_traceback(text: str) -> None:
    assert "Traceback" not in text and "Exception ignored" not in text, text[-4000:]


def _done_lines(out: str) -> list[str]:
    return sorted(line for line in out.splitlines() if re.match(r"rank \d+ done:", line))


def _errors(diag: dict) -> list[dict]:
    return [f for f in diag["findings"] if f["severity"] == "error" or f["kind"] == "crash"]


def _diagnose(procs: Procs, run_dir: Path) -> tuple[int, dict, str]:
    proc = procs.distdoctor("diagnose", run_dir, "--json")
    code = proc.finish(60)
    _no_traceback(proc.err)
    return code, json.loads(proc.out), proc.err


def _diagnose_any(procs: Procs, run_dir: Path) -> tuple[int, dict, str]:
    """diagnose --json where findings may exist (exit 1)."""
    proc = procs.distdoctor("diagnose", run_dir, "--json")
    code = proc.finish(60)
    return code, (json.loads(proc.out) if code in (0, 1) else {}), proc.err


def _op_counts(run_dir: Path) -> list[int]:
    run = read_incarnations(run_dir)[-1]
    return [len(run.events.get(r, [])) for r in (0, 1)]
