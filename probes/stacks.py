"""Stack probe: the Python stacks (native frames optional) of stuck rank processes.

`dump_stacks` runs `py-spy dump --pid` for every rank at once, within a deadline. Where py-spy
cannot attach (not installed, no ptrace permission, a container without CAP_SYS_PTRACE), it
falls back to an in-process dump: a rank that called `install_stack_dump_handler(path)` at
start-up has faulthandler write its main thread's stack to `path` on SIGUSR2; `dump_stacks`
sends the signal to that thread and reads what was appended. `StackDump.method` says which
way was used.

The main thread only: faulthandler dumps from inside the signal handler, without the GIL,
and walking the frames of a thread that runs meanwhile (the tracer's sampler, a job's data
thread, while the main thread waits in a collective with the GIL released) reads frames as
they are freed: a job under distdoctor died of SIGSEGV in a dump, and a process with two
threads making deep calls died after 4 and 7 signals (the current thread alone: alive
after 1,700). The handler runs on the thread it dumps, which is stopped while it does.

The registry of dump files lives in a per-user dir under the shared temp dir, made and read
through distdoctor/privatefiles.py: a dir another user made (or a link, or one others can
write) is refused with one line and the fallback is off, so no rank writes through a link.

Safety: the handler is only installed where nothing else handles the signal (a job's own
SIGUSR2 handler is left alone), the signal is only sent to a process that registered a
handler (pid and start time match its registry entry) and still catches the signal, so a
dump never kills a rank.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import faulthandler
import fcntl
import functools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from distdoctor.privatefiles import (
    PrivateDir,
    PrivateDirRefused,
    close_if_ours,
    identity_of,
    state_dir_path,
    still_ours,
)

PY_SPY = "py-spy"
SIGNAL = "signal"
UNAVAILABLE = "unavailable"
_handler_file = None  # the descriptor faulthandler writes to
_handler: dict = {}  # path, signal and (device, inode) of that file
HIGH_FD = 900  # where the descriptor is moved (see _register)
RESIGNAL_S = 1.5  # an in-process dump not begun after this is asked for again
REGISTRY = "distdoctor-stacks"
_ENTRY_LIMIT = 64 << 10  # a registry entry is a few hundred bytes
_said: set[str] = set()  # refusals already printed by this process


@dataclass(frozen=True)
class StackDump:
    text: str
    method: str  # "py-spy" | "signal" | "unavailable"
    error: str | None = None


def find_py_spy() -> str | None:
    """The py-spy next to this Python (a virtualenv's bin/) or on PATH."""
    here = Path(sys.executable).parent / ("py-spy.exe" if os.name == "nt" else "py-spy")
    if here.is_file() and os.access(here, os.X_OK):
        return str(here)
    return shutil.which("py-spy")


# -- the in-process fallback ---------------------------------------------------------------
def registry_dir() -> Path:
    """Where ranks note their dump file: one small JSON per pid, private to this user."""
    return Path(state_dir_path(REGISTRY))


def _open_registry(create: bool) -> PrivateDir | None:
    """The registry, checked; None (and one line, once per process) where it is refused."""
    try:
        return PrivateDir.open(str(registry_dir()), create=create)
    except PrivateDirRefused as exc:
        if create or registry_dir().exists() or registry_dir().is_symlink():
            _say_once(f"distdoctor: stack dumps by signal are off: {exc}")
        return None


def _say_once(line: str) -> None:
    if line in _said:
        return
    _said.add(line)
    try:
        print(line, file=sys.stderr, flush=True)
    except Exception:  # a closed stderr: nothing to say it on
        pass


def _entry_name(pid: int) -> str:
    return f"{pid}.json"


def _create_time(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def install_stack_dump_handler(path: str, signum: int | None = None) -> bool:
    """Make this process dump all threads' Python stacks to `path` (appending) on SIGUSR2.

    Call once at rank start-up. Never raises; returns False (and installs nothing) where the
    signal already has a handler, or on a platform without it.
    """
    global _handler_file
    try:
        signum = signum if signum is not None else getattr(signal, "SIGUSR2", None)
        if signum is None:
            return False
        if _handler_file is not None:
            return True
        if signal.getsignal(signum) not in (signal.SIG_DFL, signal.SIG_IGN):
            return False  # the job's own handler: leave it alone
        registry = _open_registry(create=True)
        if registry is None:
            return False  # said once; no dump rather than one written through a link
        with registry:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            _handler.update(path=path, signum=signum)
            _handler_file = _register(path, signum)
            entry = {"pid": os.getpid(), "path": os.path.abspath(path), "signal": int(signum),
                     "create_time": _create_time(os.getpid())}
            try:
                registry.write(_entry_name(os.getpid()), json.dumps(entry).encode())
            except OSError:
                _unregister()  # run could not find it: no handler left behind
                return False
        atexit.register(_remove, os.getpid())
        return True
    except Exception:
        return False


def _unregister() -> None:
    global _handler_file
    with contextlib.suppress(Exception):
        faulthandler.unregister(_handler["signum"])
    if _handler_file is not None:
        with contextlib.suppress(OSError):
            os.close(_handler_file)
    _handler_file = None


def _register(path: str, signum: int) -> int:
    """faulthandler writes to a descriptor number, which a job may close and reuse for a
    file of its own (a daemonising library's closerange): ours is moved high, where the
    lowest-free rule of open() rarely reaches, and checked by keep_stack_dump_handler."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW,
                 0o644)
    try:
        high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, HIGH_FD)
    except OSError:
        high = fd
    else:
        os.close(fd)
    # chain=False: chaining to the default action would terminate the rank; all_threads
    # would walk threads that run meanwhile (the module's docstring)
    faulthandler.register(signum, file=high, all_threads=False, chain=False)
    _handler["identity"] = identity_of(high)
    return high


def keep_stack_dump_handler() -> None:
    """Called now and then in the rank (its heartbeat): if the job closed our descriptor
    (and may reuse its number), register the dump on a new one; if the job took the
    signal for a handler of its own since (a preemption handler that checkpoints and
    requeues), give it up, so that `run` never sends it. Never raises."""
    global _handler_file
    if _handler_file is None:
        return
    try:
        if signal.getsignal(_handler["signum"]) not in (signal.SIG_DFL, signal.SIG_IGN, None):
            _give_up_to_the_job()
            return
    except Exception:
        return
    if still_ours(_handler_file, _handler.get("identity")):
        return
    try:
        _handler_file = _register(_handler["path"], _handler["signum"])
    except Exception:
        faulthandler.unregister(_handler["signum"])  # no dump rather than into a job's file
        _handler_file = None


def _give_up_to_the_job() -> None:
    """The job's own handler holds the signal now: our registry entry goes (`run` sends
    the signal only to a registered process) and our descriptor is closed. faulthandler is
    not unregistered: that would put back the action from before ours, the default,
    over the job's handler. The descriptor is closed only if it is still ours: a job
    that closed it may have a file of its own under that number."""
    global _handler_file
    close_if_ours(_handler_file, _handler.get("identity"))
    _handler_file = None
    _remove(os.getpid())


def _remove(pid: int) -> None:
    if os.getpid() != pid:  # a forked child's exit: the entry is its parent's
        return
    try:
        registry = _open_registry(create=False)
        if registry is not None:
            with registry:
                registry.remove(_entry_name(pid))
    except Exception:  # at exit: nothing to do about it
        pass


def _registered(pid: int) -> dict | None:
    """The pid's registry entry, if it is ours and the process is the one that wrote it."""
    registry = _open_registry(create=False)
    if registry is None:
        return None
    try:
        with registry:
            entry = json.loads(registry.read(_entry_name(pid), _ENTRY_LIMIT))
    except (OSError, ValueError):
        return None
    if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
        return None
    ct = _create_time(pid)
    if ct is None or entry.get("create_time") is None or abs(ct - entry["create_time"]) > 1.0:
        return None  # gone, or the pid was reused
    return entry


def _catches(pid: int, signum: int) -> bool:
    """Whether the process has a handler for `signum` right now (Linux /proc; True elsewhere)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    except (OSError, ValueError, IndexError):
        return sys.platform != "linux"
    return False


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _read_from(path: str, start: int) -> str:
    """What the rank appended to its dump file after `start` (no link followed, never a
    wait on a FIFO put there: this runs in the live engine's pass; DUMP_READ_BYTES)."""
    from distdoctor.privatefiles import open_regular

    try:
        fd, _ = open_regular(path)
    except OSError as exc:
        return f"(the dump file could not be read: {exc.strerror or exc})"
    with os.fdopen(fd, errors="replace") as f:
        f.seek(start)
        return f.read(DUMP_READ_BYTES)


DUMP_READ_BYTES = 4 << 20  # a dump's text (a few KB a thread)


@functools.cache
def _tgkill():
    """glibc's tgkill (2.30 on), or None."""
    try:
        return ctypes.CDLL(None, use_errno=True).tgkill
    except (OSError, AttributeError):
        return None


def _signal_main_thread(pid: int, signum: int) -> None:
    """`signum` to the process's main thread (whose thread id is the pid), not to whichever
    thread the kernel picks: the dump is of the thread the handler runs on."""
    tgkill = _tgkill()
    if tgkill is None:
        os.kill(pid, signum)  # the kernel mostly picks the main thread too
        return
    if tgkill(pid, pid, signum) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def _signal_dumps(pids: dict[int, int], why: dict[int, str],
                  deadline: float) -> dict[int, StackDump]:
    out: dict[int, StackDump] = {}
    waiting: dict[int, tuple[str, int]] = {}
    for rank, pid in pids.items():
        entry = _registered(pid)
        signum = int(entry["signal"]) if entry else 0
        if not entry or not _catches(pid, signum):
            out[rank] = StackDump("", UNAVAILABLE, f"{why[rank]}; and no in-process stack-dump "
                                  "handler is registered for this process")
            continue
        start = _size(entry["path"])
        try:
            _signal_main_thread(pid, signum)
        except OSError as e:
            out[rank] = StackDump("", UNAVAILABLE, f"{why[rank]}; signal failed: {e}")
            continue
        waiting[rank] = (entry["path"], start)
    last_sizes: dict[int, tuple[int, float]] = {}
    # a job that closed the handler's descriptor gets a new one within a heartbeat (1 s):
    # a dump that has not begun by then is asked for once more
    again_at = time.monotonic() + RESIGNAL_S
    while waiting and time.monotonic() < deadline:
        time.sleep(0.02)
        if again_at is not None and time.monotonic() > again_at:
            again_at = None
            for rank, (path, start) in waiting.items():
                entry = _registered(pids[rank])
                if _size(path) == start and entry:
                    with contextlib.suppress(OSError):
                        _signal_main_thread(pids[rank], int(entry["signal"]))
        for rank, (path, start) in list(waiting.items()):
            size, now = _size(path), time.monotonic()
            prev = last_sizes.get(rank)
            if size > start and prev and prev[0] == size and now - prev[1] >= 0.2:
                out[rank] = StackDump(_read_from(path, start), SIGNAL)
                del waiting[rank]
            elif not prev or prev[0] != size:
                last_sizes[rank] = (size, now)
    for rank in waiting:
        out[rank] = StackDump("", UNAVAILABLE, f"{why[rank]}; the in-process dump did not "
                              "arrive in time")
    return out


# -- py-spy ------------------------------------------------------------------------------
def _py_spy_dumps(exe: str, pids: dict[int, int], native: bool,
                  deadline: float) -> tuple[dict[int, StackDump], dict[int, str]]:
    done: dict[int, StackDump] = {}
    failed: dict[int, str] = {}
    procs = {}
    for rank, pid in pids.items():
        cmd = [exe, "dump", "--pid", str(pid)] + (["--native"] if native else [])
        try:
            procs[rank] = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                           stdin=subprocess.DEVNULL, text=True,
                                           errors="replace")
        except OSError as e:
            failed[rank] = f"py-spy could not start: {e}"
    for rank, proc in procs.items():
        try:
            out, err = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            failed[rank] = "py-spy timed out"
            continue
        if proc.returncode == 0 and out.strip():
            done[rank] = StackDump(out, PY_SPY)
        else:
            msg = (err.strip() or out.strip() or f"exit {proc.returncode}").splitlines()
            failed[rank] = f"py-spy failed: {msg[0] if msg else ''}"
    return done, failed


def dump_stacks(pids: dict[int, int], native: bool = False, timeout_s: float = 10.0, *,
                py_spy: str | None = None, use_py_spy: bool = True) -> dict[int, StackDump]:
    """rank -> StackDump for each `rank: pid`, within about `timeout_s` in all.

    py-spy first (all ranks in parallel); the signal-triggered in-process dump for the ranks
    py-spy could not read. `py_spy` overrides the binary; `use_py_spy=False` skips it.
    """
    deadline = time.monotonic() + timeout_s
    exe = (py_spy or find_py_spy()) if use_py_spy else None
    if exe:
        done, failed = _py_spy_dumps(exe, pids, native, deadline - min(2.0, timeout_s / 4))
    else:
        done, failed = {}, {r: ("py-spy is not installed" if use_py_spy else
                                "py-spy not used") for r in pids}
    if failed:
        done.update(_signal_dumps({r: pids[r] for r in failed}, failed,
                                  max(deadline, time.monotonic() + 0.5)))
    return {r: done[r] for r in pids}
