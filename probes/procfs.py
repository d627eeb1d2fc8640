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


class ThreadRunq:
    """How long all of a process's threads have waited for a CPU (ns): the sum of
    /proc/PID/task/*/schedstat's second field. Each thread's file is kept open between
    ticks and read again from its start: the open was two thirds of a read, and a GPU
    rank has tens of threads (8 ranks of 41 threads: 4.6 ms a tick, most of it opens). A
    kept file of a thread that ended fails its read (its tid, reused, is opened anew). At
    most `budget` files are kept (a quarter of the open-files limit, as the follower's
    logs); past it, a thread's file is opened for each read."""

    def __init__(self, budget: int | None = None):
        self.budget = _quarter_of_open_files() if budget is None else budget
        self._kept: dict[int, dict[str, int]] = {}  # pid -> tid -> its open schedstat
        self._count = 0

    def total(self, pid: int) -> int | None:
        """None when the process is gone."""
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            self.forget(pid)
            return None
        kept = self._kept.setdefault(pid, {})
        for tid in set(kept).difference(tids):  # threads that ended
            self._drop(kept, tid)
        total = 0
        for tid in tids:
            fd = kept.get(tid)
            if fd is not None:
                try:
                    total += int(os.pread(fd, 256, 0).split()[1])
                    continue
                except OSError:  # it ended, and a new thread has its tid
                    self._drop(kept, tid)
                except (ValueError, IndexError):
                    continue
            try:
                fd = os.open(f"/proc/{pid}/task/{tid}/schedstat", os.O_RDONLY)
            except OSError:
                continue
            try:
                total += int(os.pread(fd, 256, 0).split()[1])
            except (OSError, ValueError, IndexError):
                os.close(fd)
                continue
            if self._count < self.budget:
                kept[tid], self._count = fd, self._count + 1
            else:
                os.close(fd)
        return total

    def forget(self, pid: int) -> None:
        """Close what is kept of a process no longer sampled."""
        kept = self._kept.pop(pid, {})
        for tid in list(kept):
            self._drop(kept, tid)

    def retain(self, pids) -> None:
        """Keep files of `pids` only (the ranks sampled now)."""
        for pid in set(self._kept).difference(pids):
            self.forget(pid)

    def _drop(self, kept: dict[str, int], tid: str) -> None:
        os.close(kept.pop(tid))
        self._count -= 1


def _quarter_of_open_files() -> int:
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        return 0
    return 1 << 16 if soft < 0 or soft == resource.RLIM_INFINITY else soft // 4


def read_all(path: str) -> bytes:
    """A /proc file of any length (/proc/net/dev: a line per interface)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


class HostCounters:
    """The node's CPU, memory and network readings as psutil gave them (cpu_percent,
    cpu_times_percent's steal, virtual_memory's total and available, net_io_counters'
    bytes), each from one read of its /proc file: psutil read /proc/stat twice and built
    every field of every file, 0.4 ms of a sampler tick's 1.1 ms. The CPU is measured
    since the last read, the first one since this object was made."""

    def __init__(self):
        self._cpu = cpu_times()
        self._nics: dict[bytes, tuple[int, int]] = {}  # interface -> its bytes, last read
        self._carried: dict[bytes, tuple[int, int]] = {}  # what it had before going back

    def cpu(self) -> tuple[float, float | None]:
        """(busy %, steal %) of all cores since the last call: psutil's formulas (the
        guests are in user time already; idle and I/O wait are not busy)."""
        now = cpu_times()
        d = [max(0, b - a) for a, b in zip(self._cpu, now, strict=False)]
        self._cpu = now
        total = sum(d)
        for guest in d[8:10]:  # guest, guest_nice (in this order: psutil's very floats)
            total -= guest
        busy = total - d[3] - (d[4] if len(d) > 4 else 0)
        pct = round(busy / total * 100, 1) if total else 0.0
        steal = min(max(0.0, round(d[7] * (100.0 / max(1, total)), 1)), 100.0) \
            if len(d) > 7 else None
        return pct, steal

    def memory(self) -> tuple[int, int] | None:
        """(total, available) bytes; None where the kernel gives no MemAvailable (psutil
        estimates it there)."""
        mems = {}
        for line in read_proc("/proc/meminfo").split(b"\n"):
            key, _, value = line.partition(b":")
            if key in (b"MemTotal", b"MemFree", b"MemAvailable"):
                mems[key] = int(value.split()[0]) * 1024
        avail = mems.get(b"MemAvailable")
        if not avail:
            return None
        total = mems[b"MemTotal"]
        return total, (mems[b"MemFree"] if avail > total else avail)

    def net(self) -> tuple[int, int] | None:
        """(sent, received) bytes of all interfaces, as psutil's nowrap sums: an
        interface's counter that goes back (wrapped, or reset) adds what it had reached,
        until the interface goes away."""
        nics, carried, sent, recv = {}, {}, 0, 0
        for line in read_all("/proc/net/dev").split(b"\n")[2:]:
            name, colon, rest = line.rpartition(b":")
            if not colon:
                continue
            fields, nic = rest.split(), name.strip()
            now = nics[nic] = (int(fields[8]), int(fields[0]))
            last = self._nics.get(nic)
            add = (0, 0) if last is None else tuple(
                c + (a if b < a else 0)
                for a, b, c in zip(last, now, self._carried[nic], strict=True))
            carried[nic] = add
            sent, recv = sent + now[0] + add[0], recv + now[1] + add[1]
        self._nics, self._carried = nics, carried
        return (sent, recv) if nics else None


def cpu_times() -> list[float]:
    """/proc/stat's first line: all cores' user, nice, system, idle, iowait, irq, softirq,
    steal, guest, guest_nice seconds (as far as the kernel gives them)."""
    return [int(v) / CLK_TCK for v in read_proc("/proc/stat").split(b"\n", 1)[0].split()[1:11]]
