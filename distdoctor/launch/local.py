"""Run a job's processes and watch them: N local ranks (`--nproc`), or one launcher.

When a rank fails, the others are usually stuck waiting for it in a collective; they are
stopped after a grace period (torchrun stops them at once), which leaves time for the
diagnosis to read their event logs. Every process gets its own process group so the
whole tree (a launcher's workers included) can be signalled and nothing is left behind.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class Proc:
    rank: int | None  # None for a wrapped launcher
    popen: subprocess.Popen
    exit_code: int | None = None
    stopped: bool = False  # still running when distdoctor stopped the job

    @property
    def signal_name(self) -> str | None:
        if self.exit_code is not None and self.exit_code < 0:
            try:
                return signal.Signals(-self.exit_code).name
            except ValueError:
                return f"signal {-self.exit_code}"
        return None


@dataclass
class JobResult:
    exit_code: int
    procs: list[Proc] = field(default_factory=list)
    stopped: bool = False  # distdoctor stopped the job (rank failure, hang, interrupt)


MAX_PARTIAL_LINE = 1 << 16  # a line longer than this is scanned in pieces
HOLD_TAIL_S = 0.05  # a tail with no line end waits this long for the rest of its line


def _forward(src, dst, rank, on_line) -> None:
    """Copy a child's stream to ours byte for byte, a line at a time, so the ranks' lines
    do not cut into each other; `\r` ends a line too (a progress bar's updates are not
    held back), and a tail with no line end (a prompt) is written once it has been quiet
    for HOLD_TAIL_S. Each complete line also goes to `on_line` (which must not raise or
    block: the job's output waits on it)."""
    out = getattr(dst, "buffer", dst)
    fd = src.fileno()
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    held = b""  # written once its line ends, or once it goes quiet
    partial = b""  # the line being assembled for on_line
    while True:
        if held and not poller.poll(HOLD_TAIL_S * 1000):
            _write(out, held)
            held = b""
            continue
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        data = held + chunk
        cut = max(data.rfind(b"\n"), data.rfind(b"\r")) + 1
        if len(data) - cut > MAX_PARTIAL_LINE:
            cut = len(data)
        if cut:
            _write(out, data[:cut])
        held = data[cut:]
        *lines, partial = (partial + chunk).split(b"\n")
        if len(partial) > MAX_PARTIAL_LINE:
            lines.append(partial)
            partial = b""
        for raw in lines:
            _show(on_line, rank, raw)
    if held:
        _write(out, held)
    if partial:
        _show(on_line, rank, partial)
    src.close()


_WRITE_LOCK = threading.Lock()  # one forwarder's lines at a time


def _write(out, data: bytes) -> None:
    try:
        with _WRITE_LOCK:
            out.write(data)
            out.flush()
    except (OSError, ValueError):
        pass  # our stdout is gone (a closed pipe): keep draining, never block the job


def _show(on_line, rank, raw: bytes) -> None:
    try:
        on_line(rank, raw.decode("utf-8", "replace"))
    except Exception:
        pass


def python_command(cmd: list[str]) -> list[str]:
    """`train.py args` runs under this interpreter; anything else runs as given."""
    if cmd and cmd[0].endswith(".py"):
        return [sys.executable, *cmd]
    return cmd


class Job:
    def __init__(self, procs: list[Proc], grace_s: float = 5.0):
        self.procs = procs
        self.grace_s = grace_s
        self.stopped = False
        self.failures: list[Proc] = []  # in the order their exits were seen
        self._stop_deadline: float | None = None

    @classmethod
    def start(cls, commands: list[tuple[int | None, list[str], dict]], grace_s: float = 5.0,
              on_line: Callable[[int | None, str], None] | None = None):
        """Start the processes. With `on_line`, their stdout and stderr pass through pipes:
        every line is forwarded unchanged to ours and handed to `on_line(rank, text)`."""
        procs = []
        for rank, cmd, env in commands:
            pipe = subprocess.PIPE if on_line else None
            if on_line:  # through a pipe Python would block-buffer: keep lines timely
                env = {"PYTHONUNBUFFERED": "1", **env}
            popen = subprocess.Popen(cmd, env=env, start_new_session=True,
                                     stdin=subprocess.DEVNULL, stdout=pipe, stderr=pipe)
            procs.append(Proc(rank, popen))
            if on_line:
                for src, dst in ((popen.stdout, sys.stdout), (popen.stderr, sys.stderr)):
                    threading.Thread(target=_forward, args=(src, dst, rank, on_line),
                                     daemon=True, name=f"distdoctor-tee-{rank}").start()
        return cls(procs, grace_s)

    def poll(self) -> bool:
        """Collect exits; returns True while any process runs."""
        running = False
        for p in self.procs:
            if p.exit_code is None:
                code = p.popen.poll()
                if code is None:
                    running = True
                else:
                    p.exit_code = code
                    if code != 0:
                        self.failures.append(p)
        if self.failures and running and self._stop_deadline is None:
            self._stop_deadline = time.monotonic() + self.grace_s
        if self._stop_deadline is not None and running and time.monotonic() > self._stop_deadline:
            self.stop()
        return running

    def stop(self, sig: int = signal.SIGTERM, kill_after_s: float = 5.0) -> None:
        """Signal every process group, then SIGKILL what is left after `kill_after_s`."""
        self.stopped = True
        for p in self.procs:
            if p.popen.poll() is None:
                p.stopped = True
        self._signal_all(sig)
        deadline = time.monotonic() + kill_after_s
        while time.monotonic() < deadline and any(p.popen.poll() is None for p in self.procs):
            time.sleep(0.05)
        self._signal_all(signal.SIGKILL)
        for p in self.procs:
            if p.exit_code is None:
                try:
                    p.exit_code = p.popen.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass

    def _signal_all(self, sig: int) -> None:
        for p in self.procs:
            if p.popen.poll() is None:
                try:
                    os.killpg(p.popen.pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass

    def exit_code(self) -> int:
        """The job's exit code: the first failure's (128 + signal for a killed process)."""
        if not self.failures:
            return 1 if self.stopped else 0
        code = self.failures[0].exit_code
        return 128 - code if code < 0 else code
