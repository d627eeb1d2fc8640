"""Evidence of a rank's progress, read from outside it: /proc of its process and of its
child processes (DataLoader workers). A few small file reads per look, no signal, no
ptrace, nothing the rank notices: `distdoctor run` looks only at the ranks others wait
for, at most every READ_PERIOD_S.

    main thread  /proc/PID/task/PID/schedstat  CPU time, run-queue wait (ns)
                 /proc/PID/task/PID/stat       state (R, S, D, ...)
    the process  /proc/PID/stat                utime + stime of all its threads
                 /proc/PID/io                  rchar + wchar (every read and write)
    children     /proc/PID/task/*/children     the same, for each child, two levels down
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

READ_PERIOD_S = 0.5
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
MAX_CHILDREN = 64


@dataclass(frozen=True)
class Reading:
    """One look at a rank's process from outside; counters are cumulative (what
    diagnosis/hangs/progress.py judges)."""

    t: float  # monotonic seconds (the reader's clock)
    cpu_s: float  # the main thread's CPU time
    runq_s: float  # the main thread's time runnable but waiting for a CPU
    tree_cpu_s: float  # every thread of the rank and of its child processes
    io_bytes: int  # bytes read and written by them (rchar + wchar)
    state: str  # the main thread: R running, S sleeping, D disk sleep, T stopped, ...
    disk_wait: bool = False  # a thread of the rank or a child is in disk sleep


def _read(path: str) -> str | None:
    try:
        with open(path, "rb") as fh:
            return fh.read(4096).decode("ascii", "replace")
    except OSError:
        return None


def _stat(pid: int) -> tuple[str, float] | None:
    """(state, CPU seconds of every thread) of a process."""
    text = _read(f"/proc/{pid}/stat")
    if text is None:
        return None
    try:
        rest = text.rsplit(")", 1)[1].split()
        return rest[0], (int(rest[11]) + int(rest[12])) / _TICK
    except (IndexError, ValueError):
        return None


def _io(pid: int) -> int:
    text = _read(f"/proc/{pid}/io")
    if not text:
        return 0
    total = 0
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in ("rchar", "wchar"):
            try:
                total += int(value)
            except ValueError:
                pass
    return total


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        text = _read(f"/proc/{pid}/task/{tid}/children")
        if text:
            out += [int(c) for c in text.split() if c.isdigit()]
        if len(out) >= MAX_CHILDREN:
            break
    return out[:MAX_CHILDREN]


def read_progress(pid: int) -> Reading | None:
    """One look at a rank process; None when it is gone or unreadable."""
    now = time.monotonic()
    main = _stat(pid)
    if main is None:
        return None
    state, tree_cpu = main
    sched = _read(f"/proc/{pid}/task/{pid}/schedstat")
    try:
        cpu_ns, runq_ns = (int(x) for x in sched.split()[:2]) if sched else (0, 0)
    except ValueError:
        cpu_ns = runq_ns = 0
    thread = _read(f"/proc/{pid}/task/{pid}/stat")
    if thread:
        try:
            state = thread.rsplit(")", 1)[1].split()[0]
        except IndexError:
            pass
    io = _io(pid)
    disk = state == "D"
    level = _children(pid)
    for _depth in range(2):
        below: list[int] = []
        for child in level:
            st = _stat(child)
            if st is None:
                continue
            tree_cpu += st[1]
            disk = disk or st[0] == "D"
            io += _io(child)
            below += _children(child)
        level = below[:MAX_CHILDREN]
    if not sched:  # no schedstat (a kernel without it): the process's CPU stands in
        cpu_ns = int(main[1] * 1e9)
    return Reading(now, cpu_ns / 1e9, runq_ns / 1e9, tree_cpu, io, state, disk)


class ProgressReader:
    """Rate-limited looks at rank processes (rank -> pid)."""

    def __init__(self, period_s: float = READ_PERIOD_S):
        self.period_s = period_s
        self._last: dict[int, float] = {}

    def read(self, pids: dict[int, int]) -> dict[int, Reading]:
        out = {}
        now = time.monotonic()
        for rank, pid in pids.items():
            if now - self._last.get(rank, -1e9) < self.period_s:
                continue
            r = read_progress(pid)
            if r is not None:
                self._last[rank] = now
                out[rank] = r
        return out
