"""The /proc readers of the sampler (Linux): a process's stat, every process's (the host's
other processes, host.py), and the run queue delay of all a process's threads. Each file
is read with os.open and one read: a third of what open() costs (its buffered file
object), for what the sampler reads once a second per rank and per thread."""

from __future__ import annotations

import os

CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
PROCFS = os.path.isdir("/proc/self/task")  # else psutil reads the ranks (host.py)


def read_proc(path: str) -> bytes:
    """A small /proc file whole (stat, schedstat: under a page)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, 4096)
    finally:
        os.close(fd)


def stat_fields(pid) -> list[bytes]:
    """/proc/PID/stat's fields after the command name (the state letter first)."""
    data = read_proc(f"/proc/{pid}/stat")
    return data[data.rindex(b")") + 2:].split()


def rank_stat(pid: int) -> tuple[str, int, int, int, int]:
    """(state letter, CPU ticks (user + system), start time, threads, resident pages),
    the counters psutil read from stat, status and statm. The resident pages are statm's:
    stat's own count is the kernel's per-CPU estimate (off by tens of pages)."""
    f = stat_fields(pid)
    rss = int(read_proc(f"/proc/{pid}/statm").split()[1])
    return f[0].decode(), int(f[11]) + int(f[12]), int(f[19]), int(f[17]), rss


def stat_row(pid) -> tuple[int, int, int] | None:
    """(parent pid, CPU ticks (user + system), start time) of a process, from
    /proc/PID/stat; None when it is gone or unreadable."""
    try:
        fields = stat_fields(pid)
        return int(fields[1]), int(fields[11]) + int(fields[12]), int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


def proc_table() -> dict[int, tuple[int, int, int]] | None:
    """pid -> stat_row of every process on the machine; None without /proc."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return None
    out = {}
    for name in names:
        if name.isdigit():
            row = stat_row(name)
            if row is not None:
                out[int(name)] = row
    return out


def runq_ns(pid: int) -> int | None:
    """How long all the process's threads have waited for a CPU (ns): the sum of
    /proc/PID/task/*/schedstat's second field; None when it is gone."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    total = 0
    for tid in tids:
        try:
            total += int(read_proc(f"/proc/{pid}/task/{tid}/schedstat").split()[1])
        except (OSError, ValueError, IndexError):
            continue
    return total
