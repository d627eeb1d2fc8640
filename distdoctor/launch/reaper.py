"""Every process of a job, however it detaches, and how to stop them all.

A job's processes do not stay in one process group: torchrun starts each worker in a
session of its own, a daemon double-forks or calls setsid, and the workers of a launcher
that dies are reparented. Two nets catch them (the job is their union):

- the tree: `distdoctor run` becomes a child subreaper (Linux), so an orphan of the job is
  reparented to it rather than to init and stays a descendant of what run started;
- the cookie: every process of the job inherits DISTDOCTOR_JOB=<id> (as Jenkins'
  ProcessTreeKiller tags builds with BUILD_ID); a process of our uid whose
  /proc/PID/environ carries the id is the job's, wherever it was reparented. Once `run`
  is gone the guardian (guardian.py) has this net alone.

A process is named by its pid and its start time, and signalled through a pidfd after
checking that start time: a pid reused by an unrelated process is never signalled.
Without /proc (not Linux) only the processes run started are known; they are signalled
by process group, as before.

Standard library only, no distdoctor import: the guardian loads this file in a bare
interpreter (`python -I -S`) so that it starts in milliseconds.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import time
from collections.abc import Callable, Iterable

JOB_ENV = "DISTDOCTOR_JOB"
PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>
SCAN_PERIOD_S = 0.1  # how often a stop looks again (a look: ~2 ms per 100 processes)
KILL_WAIT_S = 5.0  # after SIGKILL: how long to wait for what cannot die at once (D state)
CAN_SCAN = os.path.isdir("/proc/self")


class Member:
    """One process of the job. A plain class: dataclasses would double the guardian's
    start time."""

    __slots__ = ("pid", "start", "command", "rank")

    def __init__(self, pid: int, start: int | None, command: str = "",
                 rank: int | None = None):
        self.pid = pid
        self.start = start  # clock ticks since boot; None: unknown (no /proc)
        self.command = command  # short, for messages
        self.rank = rank  # RANK in its environment, when read

    def __repr__(self) -> str:
        return f"Member({self.pid}, {self.command!r})"


# -- the cookie ----------------------------------------------------------------------------
def new_cookie() -> str:
    import uuid

    return uuid.uuid4().hex


def tag_env(env: dict, cookie: str) -> dict:
    """`env` with the job's cookie added; an outer job's cookie is kept beside it (a nested
    `distdoctor run` stays the outer job's too)."""
    env = dict(env)
    env[JOB_ENV] = ",".join(c for c in (env.get(JOB_ENV), cookie) if c)
    return env


# -- the subreaper -------------------------------------------------------------------------
def become_subreaper() -> bool:
    """Make orphaned descendants reparent to this process (Linux >= 3.4). Lasts for the
    life of the process, which must then reap them (`reap_orphans`)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def reap_orphans(keep: Iterable[int]) -> None:
    """Collect the exit of orphans reparented to us, so they do not linger as zombies.

    Never a pid in `keep` (a Popen object waits for it), nor a child in our own session:
    run's own helpers (py-spy) are started there and their callers wait for them, while
    the job's processes all live in sessions of their own. A zombie we must not take
    ends the round; it is collected by its owner soon."""
    keep, own_sid = set(keep), os.getsid(0)
    while True:
        try:
            info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except (ChildProcessError, AttributeError, OSError):
            return
        if info is None or info.si_pid in keep:
            return
        try:
            if os.getsid(info.si_pid) == own_sid:
                return
            os.waitpid(info.si_pid, os.WNOHANG)
        except OSError:
            return


# -- finding the job's processes ----------------------------------------------------------
def _stat(pid: int) -> tuple[int, int, bytes, int] | None:
    """(ppid, session, state, start time) from /proc/PID/stat; None when gone."""
    try:  # os.open, not open(): half the cost, and a stop reads every process's stat
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
        try:
            data = os.read(fd, 4096)
        finally:
            os.close(fd)
        rest = data[data.rindex(b")") + 2:].split()  # the name may hold spaces and ')'
        return int(rest[1]), int(rest[3]), rest[0], int(rest[19])
    except (OSError, ValueError, IndexError):
        return None


def start_time(pid: int) -> int | None:
    st = _stat(pid)
    return st[3] if st else None


def _environ(pid: int) -> dict[bytes, bytes]:
    """The variables of PID's environment this module reads."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            data = f.read()
    except OSError:
        return {}
    if JOB_ENV.encode() not in data:
        return {}
    out = {}
    for item in data.split(b"\0"):
        key, _, value = item.partition(b"=")
        if key in (JOB_ENV.encode(), b"RANK"):
            out[key] = value
    return out


def command_of(pid: int, limit: int = 60) -> str:
    """A short command line: the program's base name and its arguments, paths shortened
    to their base names (the script's name is what tells a process apart)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().rstrip(b"\0").split(b"\0")
    except OSError:
        return "?"
    if not argv or not argv[0]:
        return "?"
    words = [a.decode("utf-8", "replace") for a in argv]
    words = [os.path.basename(w) if os.sep in w and not w.startswith("-") else w
             for w in words]
    # the process's own argv, printed to the operator and kept in exits.json: its control
    # characters shown as "?" (safetext's rule; the guardian loads this file alone, with
    # no distdoctor to import)
    text = _CONTROL.sub("?", " ".join(words))
    return text if len(text) <= limit else text[:limit - 3] + "..."


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def find_job(cookie: str, since: int, roots: Iterable[int] = (), skip: Iterable[int] = (),
             adopted: bool = False) -> dict[int, Member]:
    """The live processes of the job: those carrying `cookie`, `roots` (what run started),
    with `adopted` the orphans reparented to us from another session (we are their
    subreaper; a helper of run's own must therefore stay in run's session, or be in
    `skip`), and every descendant of these. `since`: our own start time (nothing older
    can be the job's; their environments are not even read). Zombies are left out
    (they are gone; their parent collects them)."""
    if not CAN_SCAN:
        return {}
    me, skip, roots = os.getpid(), set(skip) | {os.getpid()}, set(roots)
    uid, own_sid, needle = os.getuid(), os.getsid(0), cookie.encode()
    table: dict[int, tuple[int, int, bytes, int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) not in skip:
            st = _stat(int(name))
            if st and st[3] >= since and st[2] != b"Z":
                table[int(name)] = st
    members: dict[int, Member] = {}
    for pid, (ppid, sid, _, start) in table.items():
        env = {}
        try:
            if os.stat(f"/proc/{pid}").st_uid == uid:
                env = _environ(pid)
        except OSError:
            continue
        tagged = needle in env.get(JOB_ENV.encode(), b"").split(b",")
        if tagged or pid in roots or (adopted and ppid == me and sid != own_sid):
            members[pid] = _member(pid, start, env)
    children: dict[int, list[int]] = {}
    for pid, (ppid, *_) in table.items():
        children.setdefault(ppid, []).append(pid)
    todo = list(members)
    while todo:  # descendants, even those that cleared their environment
        for child in children.get(todo.pop(), ()):
            if child not in members:
                members[child] = _member(child, table[child][3], _environ(child))
                todo.append(child)
    return members


def _member(pid: int, start: int, env: dict[bytes, bytes]) -> Member:
    rank = env.get(b"RANK", b"")
    return Member(pid, start, command_of(pid), int(rank) if rank.isdigit() else None)


# -- stopping them ---------------------------------------------------------------------------
def send(member: Member, sig: int) -> bool:
    """Signal one process; False when it is gone or its pid now names another process."""
    if member.start is None:  # no /proc: a process run started, leader of its own group
        try:
            os.killpg(member.pid, sig)
            return True
        except OSError:
            return False
    try:
        fd = os.pidfd_open(member.pid)  # from here on the pid cannot be reused under us
    except ProcessLookupError:
        return False
    except (AttributeError, OSError):  # Linux < 5.3: check, then kill (a tiny window)
        fd = None
    try:
        if start_time(member.pid) != member.start:
            return False
        if fd is not None:
            signal.pidfd_send_signal(fd, sig)
        else:
            os.kill(member.pid, sig)
        return True
    except OSError:  # gone (ProcessLookupError), not ours (PermissionError)
        return False
    finally:
        if fd is not None:
            os.close(fd)


def stop_all(find: Callable[[], dict[int, Member]], grace_s: float,
             between: Callable[[], None] = lambda: None,
             first_signal: int = signal.SIGTERM) -> list[tuple[Member, str]]:
    """SIGTERM (`first_signal`) to every process `find` returns, and to any that appears
    while they stop; SIGKILL to what is left after `grace_s`. `between` runs before each
    look (it collects exits: a zombie child of ours would otherwise look alive). Returns
    each process signalled with the last signal it got ("not permitted": a process of
    another user, a setuid program; not waited for). Never raises for a process that
    vanished; gives up on one that outlives SIGKILL by KILL_WAIT_S (uninterruptible)."""
    sent: dict[tuple[int, int | None], tuple[Member, int | None]] = {}
    kill_at = time.monotonic() + max(0.0, grace_s)
    give_up_at = kill_at + KILL_WAIT_S
    while True:
        between()
        now = time.monotonic()
        left = [m for m in find().values() if sent.get((m.pid, m.start), (m, 0))[1] is not None]
        if not left or now > give_up_at:
            break
        sig = signal.SIGKILL if now >= kill_at else first_signal
        for m in left:
            key = (m.pid, m.start)
            if key not in sent or sent[key][1] != sig:
                if send(m, sig):
                    sent[key] = (m, sig)
                elif m.start is not None and start_time(m.pid) == m.start:
                    sent[key] = (m, None)  # there, but not ours to signal
        time.sleep(SCAN_PERIOD_S)
    return [(m, signal.Signals(sig).name if sig else "not permitted")
            for m, sig in sent.values()]
