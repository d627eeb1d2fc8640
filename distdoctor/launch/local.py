"""Run a job's processes and watch them: N local ranks (`--nproc`), or one launcher.

When a rank fails, the others are usually stuck waiting for it in a collective; they are
stopped after a grace period (torchrun stops them at once), which leaves time for the
diagnosis to read their event logs. Every process starts in a session of its own (a
terminal's Ctrl-C reaches run, which stops the job in order); stopping reaches every
process of the job, however it detached (reaper.py), and nothing outlives run
(guardian.py).
"""

from __future__ import annotations

import errno
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from distdoctor.exits import signal_name
from distdoctor.launch import reaper
from distdoctor.launch.guardian import Guardian
from distdoctor.launch.streams import write_all

# The supervision loop's look at the job when nothing wakes it. A process's exit does (a
# pidfd per process run started, Linux 5.3+), so this bounds only what has no fd: the grace
# deadlines, orphans to reap, a hang that --on-hang kill acts on. Without pidfds the loop
# looks every FALLBACK_WAIT_S, as it did always: ten looks a second were ~0.1% of a core.
WAIT_S = 0.5
FALLBACK_WAIT_S = 0.1


@dataclass
class Proc:
    rank: int | None  # None for a wrapped launcher
    popen: subprocess.Popen
    exit_code: int | None = None
    stopped: bool = False  # still running when distdoctor stopped the job

    @property
    def signal_name(self) -> str | None:
        if self.exit_code is not None and self.exit_code < 0:
            return signal_name(-self.exit_code)
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


def _write(out, data: bytes) -> None:
    try:
        write_all(out, data)
    except Exception:  # our stdout is gone (a closed pipe, None): keep draining, never
        pass  # block the job (a relay that died once left the ranks' pipes full)


def _show(on_line, rank, raw: bytes) -> None:
    try:
        on_line(rank, raw.decode("utf-8", "replace"))
    except Exception:
        pass


def _start_relay(src, dst, rank, on_line) -> None:
    try:
        threading.Thread(target=_forward, args=(src, dst, rank, on_line), daemon=True,
                         name=f"distdoctor-tee-{rank}").start()
    except RuntimeError as exc:  # "can't start new thread": a pids limit (a container's,
        # a cgroup's) reached: an OSError, so the job is stopped whole and said in a line
        raise OSError(errno.EAGAIN, f"no thread to relay its output: {exc}") from None


def python_command(cmd: list[str]) -> list[str]:
    """`train.py args` runs under this interpreter; anything else runs as given."""
    if cmd and cmd[0].endswith(".py"):
        return [sys.executable, *cmd]
    return cmd


class Job:
    """The job's processes: started, watched, and stopped all together.

    Every process of the job is known however it detaches (reaper.py: run is their
    subreaper, and each carries the job's cookie), and a guardian process stops them
    should `distdoctor run` die without doing so (guardian.py)."""

    def __init__(self, procs: list[Proc], grace_s: float = 5.0, cookie: str | None = None,
                 guardian: Guardian | None = None,
                 on_stop: Callable[[], None] | None = None,
                 say: Callable[[str], None] | None = None):
        self.procs = procs
        self.grace_s = grace_s
        self.stopped = False
        self.failures: list[Proc] = []  # in the order their exits were seen
        # processes other than `procs` that distdoctor signalled: {pid, command, rank, signal}
        self.stopped_processes: list[dict] = []
        self.cookie = cookie
        self.guardian = guardian
        self._on_stop = on_stop
        self._say = say or (lambda text: print(text, file=sys.stderr, flush=True))
        self._since = reaper.start_time(os.getpid()) or 0
        self._stop_deadline: float | None = None
        self._leftover_deadline: float | None = None
        self._pidfds: dict[int, int] | None = {} if hasattr(os, "pidfd_open") else None

    @classmethod
    def start(cls, commands: list[tuple[int | None, list[str], dict]], grace_s: float = 5.0,
              on_line: Callable[[int | None, str], None] | None = None, run_dir=None,
              on_stop: Callable[[], None] | None = None,
              say: Callable[[str], None] | None = None):
        """Start the processes. With `on_line`, their stdout and stderr pass through pipes:
        every line is forwarded unchanged to ours and handed to `on_line(rank, text)`.
        `on_stop` is called when distdoctor is about to stop the job (never raises into
        the stop); `say` prints a line (stderr by default); `run_dir` is where the
        guardian writes exits.json should run die."""
        cookie = reaper.new_cookie()
        reaper.become_subreaper()
        guardian = Guardian.start(cookie, grace_s, run_dir)
        procs = []
        try:
            for rank, cmd, env in commands:
                pipe = subprocess.PIPE if on_line else None
                env = reaper.tag_env(env, cookie)
                if on_line:  # through a pipe Python would block-buffer: keep lines timely
                    env = {"PYTHONUNBUFFERED": "1", **env}
                popen = subprocess.Popen(cmd, env=env, start_new_session=True,
                                         stdin=subprocess.DEVNULL, stdout=pipe, stderr=pipe)
                procs.append(Proc(rank, popen))
                if on_line:
                    for src, dst in ((popen.stdout, sys.stdout), (popen.stderr, sys.stderr)):
                        _start_relay(src, dst, rank, on_line)
        except OSError:
            cls(procs, 0.0, cookie, guardian).close()  # the ranks already started go too
            raise
        return cls(procs, grace_s, cookie, guardian, on_stop, say)

    def poll(self) -> bool:
        """Collect exits; returns True while any process of the job runs.

        When a process fails, the others get `grace_s` before they are stopped. When the
        command(s) run started have all exited and processes of the job remain (a killed
        launcher's workers, a daemon), those get `grace_s` too, then are stopped, with one
        line naming them."""
        running = self._collect()
        if self.failures and running and self._stop_deadline is None:
            self._stop_deadline = time.monotonic() + self.grace_s
        if self._stop_deadline is not None and running and time.monotonic() > self._stop_deadline:
            self.stop(notify=False)  # their exit codes say they were stopped
            return False
        if running:
            return True
        left = self._members()
        if not left:
            return False
        if self._leftover_deadline is None:
            self._leftover_deadline = time.monotonic() + self.grace_s
        if time.monotonic() <= self._leftover_deadline:
            return True
        names = ", ".join(f"{m.pid} ({m.command})" for m in list(left.values())[:8])
        more = f" and {len(left) - 8} more" if len(left) > 8 else ""
        self._say(f"distdoctor: the job's command ended but {len(left)} process(es) of it "
                  f"remain after {self.grace_s:g} s: {names}{more}; stopping them")
        self._notify_stop()
        self._stop_members(signal.SIGTERM)
        return False

    def wait(self, timeout_s: float = WAIT_S) -> None:
        """Until a process run started (or the guardian) ends, or `timeout_s`: the
        supervision loop's pause between two `poll`s."""
        fds = self._exit_fds()
        if fds is None:
            time.sleep(min(timeout_s, FALLBACK_WAIT_S))
        elif fds:
            poller = select.poll()
            for fd in fds:
                poller.register(fd, select.POLLIN)  # readable once the process has ended
            poller.poll(timeout_s * 1000)
        else:
            time.sleep(timeout_s)

    def _exit_fds(self) -> list[int] | None:
        """A pidfd of each process not reaped yet (its pid is still ours: an exit not
        collected leaves a zombie); None where pidfds are not to be had."""
        if self._pidfds is None:
            return None
        watched = [p.popen for p in self.procs if p.exit_code is None]
        if self.guardian is not None:
            watched.append(self.guardian.proc)
        now: dict[int, int] = {}
        for popen in watched:
            fd = self._pidfds.pop(popen.pid, None)
            if fd is None and popen.returncode is None:
                try:
                    fd = os.pidfd_open(popen.pid)
                except OSError:  # a kernel without them (ENOSYS), no fd left: as before
                    self._close_pidfds({**now, **self._pidfds})
                    self._pidfds = None
                    return None
            if fd is not None:
                now[popen.pid] = fd
        self._close_pidfds(self._pidfds)  # of processes reaped since
        self._pidfds = now
        return list(now.values())

    @staticmethod
    def _close_pidfds(fds: dict[int, int] | None) -> None:
        for fd in (fds or {}).values():
            os.close(fd)

    def stop(self, sig: int = signal.SIGTERM, notify: bool = True) -> None:
        """Stop every process of the job: `sig` (SIGTERM) to all, SIGKILL to what is left
        after `grace_s`; exit codes collected. `notify`: call `on_stop` first."""
        self.stopped = True
        for p in self.procs:
            if p.popen.poll() is None:
                p.stopped = True
        if notify:
            self._notify_stop()
        self._stop_members(sig)

    def close(self) -> None:
        """At the end of `run` (normal or not): stop whatever of the job is still there,
        then release the guardian. Never raises."""
        self._close_pidfds(self._pidfds)
        self._pidfds = None
        try:
            if self._members():
                self.stop()
        except Exception:
            pass  # the guardian, not released, finishes the work
        else:
            if self.guardian is not None:
                self.guardian.release()

    def _notify_stop(self) -> None:
        if self._on_stop is not None:
            try:
                self._on_stop()
            except Exception:  # the job is stopped whatever the diagnosis does
                pass

    def _stop_members(self, sig: int) -> None:
        own = {p.popen.pid for p in self.procs}
        stopped = reaper.stop_all(self._members, self.grace_s, self._collect, sig)
        self.stopped_processes += [{"pid": m.pid, "command": m.command, "rank": m.rank,
                                    "signal": name} for m, name in stopped
                                   if m.pid not in own]
        for p in self.procs:
            if p.exit_code is None:
                try:
                    p.exit_code = p.popen.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    pass

    def _members(self) -> dict[int, reaper.Member]:
        """The job's live processes (without /proc: the ones run started)."""
        alive = [p.popen.pid for p in self.procs if p.exit_code is None]
        if not reaper.CAN_SCAN:
            return {pid: reaper.Member(pid, None) for pid in alive}
        skip = [self.guardian.pid] if self.guardian is not None else []
        return reaper.find_job(self.cookie or "", self._since, roots=alive, skip=skip,
                               adopted=True)

    def _collect(self) -> bool:
        """Exit codes of the processes run started, and orphans reaped; True while any of
        the former runs."""
        running = False
        for p in self.procs:
            if p.exit_code is None:
                code = p.popen.poll()
                if code is None:
                    running = True
                else:
                    p.exit_code = code
                    if code != 0 and not p.stopped:
                        self.failures.append(p)
        if self.guardian is not None and self.guardian.proc.poll() is not None:
            self._say(f"distdoctor: the guardian (pid {self.guardian.pid}) ended early "
                      f"(exit {self.guardian.proc.returncode}): should run be killed now, "
                      "its job would not be stopped")
            self.guardian = None  # reaped: its zombie no longer hides orphans from the reaper
        reaper.reap_orphans(keep=[p.popen.pid for p in self.procs if p.exit_code is None]
                            + ([self.guardian.pid] if self.guardian is not None else []))
        return running

    def exit_code(self) -> int:
        """The job's exit code: the first failure's (128 + signal for a killed process)."""
        if not self.failures:
            return 1 if self.stopped else 0
        code = self.failures[0].exit_code
        return 128 - code if code < 0 else code
