"""Host probe (psutil): the node's CPU, load, memory and network, and each rank process's
liveness, state, CPU and resident memory. Snapshots are immutable; a probe keeps each
process's last CPU reading between ticks so CPU percentages cover the time since the last one.

For the machine's noise (diagnosis/stragglers/host_noise.py): the steal time, the CPU all other
processes use (not the ranks, their children or distdoctor) and the busiest of them,
grouped by program (twenty small workers of one parent are one busy program), with the
cores they may run on, and each rank process's run queue delay: how long all its threads
(gloo's workers too) waited for a CPU per second, from /proc/PID/task/*/schedstat.
"""

from __future__ import annotations

import math
import os
import socket
import time
from dataclasses import dataclass, fields

import psutil
from distdoctor.probes import procfs
from distdoctor.probes.checked import checked_fields

# psutil status -> the few states a person needs
_STATUS = {psutil.STATUS_RUNNING: "running", psutil.STATUS_SLEEPING: "sleeping",
           psutil.STATUS_DISK_SLEEP: "disk-sleep", psutil.STATUS_STOPPED: "stopped",
           psutil.STATUS_TRACING_STOP: "stopped", psutil.STATUS_ZOMBIE: "zombie",
           psutil.STATUS_DEAD: "dead", psutil.STATUS_IDLE: "sleeping"}
# /proc/PID/stat's state letter -> the same (psutil's name where _STATUS has none)
_STATE = {"R": "running", "S": "sleeping", "D": "disk-sleep", "T": "stopped",
          "t": "stopped", "Z": "zombie", "X": "dead", "x": "dead", "I": "sleeping",
          "K": "wake-kill", "W": "waking", "P": "parked"}
GONE = "gone"  # no such process (exited and reaped, or never existed)


@dataclass(frozen=True)
class ProcessSnapshot:
    rank: int
    pid: int
    alive: bool  # exists and is not a zombie
    status: str  # running | sleeping | disk-sleep | stopped | zombie | dead | gone
    cpu_pct: float | None = None  # of one core, since the previous tick
    rss_bytes: int | None = None
    threads: int | None = None
    runq_ms_per_s: float | None = None  # all its threads' wait for a CPU, per second

    def to_json(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, d: dict) -> ProcessSnapshot:
        return cls(**checked_fields(cls, d))  # a probe file is anyone's text (checked.py)


@dataclass(frozen=True)
class HostSnapshot:
    t: float
    host: str
    cpu_pct: float | None  # all cores, since the previous tick
    cpu_count: int | None
    load1: float | None
    load5: float | None
    load15: float | None
    mem_total_bytes: int | None
    mem_available_bytes: int | None
    net_sent_bytes: int | None  # cumulative since boot
    net_recv_bytes: int | None
    steal_pct: float | None = None  # of all cores, since the previous tick (VMs)
    # the other processes' busiest programs (one name, one parent): {name, pid (the
    # busiest), pids, count, cpu_pct (all of them, % of one core), cpus}
    busy: tuple = ()
    others_pct: float | None = None  # all other processes' CPU, % of one core


    def to_json(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, d: dict) -> HostSnapshot:
        return cls(**checked_fields(cls, d))


BUSY_PCT = 20.0  # the other processes are looked through from this share of a core
NOTED_PCT = 1.0  # a process counted among the others' CPU (below: idle daemons)
FRESH_LOOK_S = 0.2  # the second look at processes seen for the first time
MAX_FRESH = 2000  # ... skipped past this many (a node with a huge process table)
MAX_BUSY = 8
SCAN_S = 3.0  # the other processes looked through at most this often (~2 ms a look)


class HostProbe:
    def __init__(self):
        self.host = socket.gethostname()
        # pid -> (its start time, CPU ticks, when read): a rank's last reading; psutil's
        # Process objects where there is no /proc
        self._procs: dict[int, tuple[int, int, float] | psutil.Process] = {}
        self._runq: dict[int, tuple[float, int]] = {}  # pid -> (time, run queue ns)
        self._threads = procfs.ThreadRunq()
        # the node's CPU, memory and network counters (psutil's, where there is no /proc);
        # primed: the first real reading covers a tick
        self._counters = procfs.HostCounters() if procfs.PROCFS else None
        if self._counters is None:
            psutil.cpu_percent(interval=None)
            try:
                psutil.cpu_times_percent(interval=None)
            except Exception:
                pass
        # pid -> (its start time, CPU ticks, when read): the other processes' last look
        self._others: dict[int, tuple[int, int, float]] = {}
        self._ranks_cpu_pct = 0.0  # the rank processes' CPU at the last tick
        self._busy: tuple | None = None  # busy_others' last reading, while busy
        self._scanned_s = -math.inf

    def host_snapshot(self, job_pids=()) -> HostSnapshot:
        """`job_pids`: the ranks' processes (they, their children and this process are
        not "other" processes)."""
        try:
            load = os.getloadavg()
        except (OSError, AttributeError):
            load = (None, None, None)
        c = self._counters
        try:
            total, avail = (c and c.memory()) or _psutil_memory()
        except Exception:
            total = avail = None
        try:
            sent, recv = (c.net() if c else _psutil_net()) or (None, None)
        except Exception:
            sent = recv = None
        cpu_pct, steal = c.cpu() if c else _psutil_cpu()
        cpu_count = psutil.cpu_count()
        # the processes are looked through (~0.1 ms each) only when the node's cores are
        # busier than the ranks keep them (their use at the last tick)
        cores_used = cpu_pct * (cpu_count or 1) / 100
        others_used = cores_used - self._ranks_cpu_pct / 100
        busy, others_pct = (), None
        if others_used >= BUSY_PCT / 100:
            # the process table at its own cadence (SCAN_S): its reading covers the time
            # since the last, and the samples between repeat it
            now = time.monotonic()
            if now - self._scanned_s >= SCAN_S or self._busy is None:
                self._busy, self._scanned_s = self.busy_others(job_pids), now
            busy, others_pct = self._busy
        else:
            self._busy = None  # quiet: the next busy tick looks at once
        return HostSnapshot(t=time.time(), host=self.host,
                            cpu_pct=cpu_pct,
                            cpu_count=cpu_count, load1=load[0], load5=load[1],
                            load15=load[2], mem_total_bytes=total, mem_available_bytes=avail,
                            net_sent_bytes=sent, net_recv_bytes=recv, steal_pct=steal,
                            busy=busy, others_pct=others_pct)

    def busy_others(self, job_pids) -> tuple[tuple, float]:
        """(the busiest programs outside the job since the last call (one name, one parent);
        all their CPU, % of one core)."""
        ours = {os.getpid(), *job_pids}
        # the process table read straight from /proc (one read of each process' stat
        # file: ~15 us a process, a sixth of what a psutil look took); psutil is asked
        # only about the few busy ones, for their names and cores
        table = procfs.proc_table()
        now = time.monotonic()
        if table is None:
            return (), None
        parents = {pid: row[0] for pid, row in table.items()}
        last = self._others
        out, fresh_ones = [], []
        for pid, (_, cpu, started) in table.items():
            if _descends(pid, ours, parents):
                continue
            seen = last.get(pid)
            if seen is None or seen[0] != started:  # new, or its pid reused
                fresh_ones.append(pid)  # a rate needs a second look
                continue
            pct = _pct(cpu - seen[1], now - seen[2])
            if pct >= NOTED_PCT:
                out.append((_Proc(pid), pct))
        self._others = {pid: (row[2], row[1], now) for pid, row in table.items()}
        if fresh_ones and len(fresh_ones) <= MAX_FRESH:
            # processes seen for the first time (the first busy tick, or new ones): one
            # short second look now rather than a whole period later, so a short job's
            # noisy neighbours are named (this thread is the sampler's own)
            time.sleep(FRESH_LOOK_S)
            again = time.monotonic()
            for pid in fresh_ones:
                row = procfs.stat_row(pid)
                before = table[pid]
                if row is None or row[2] != before[2]:
                    continue
                self._others[pid] = (row[2], row[1], again)
                pct = _pct(row[1] - before[1], again - now)
                if pct >= NOTED_PCT:
                    out.append((_Proc(pid), pct))
        total = round(sum(pct for _, pct in out), 1)
        return _by_program(out, parents)[:MAX_BUSY], total

    def runq_ms_per_s(self, pid: int) -> float | None:
        """How long the process' threads waited for a CPU per second since the last call
        (the sum of /proc/PID/task/*/schedstat's second field); None on the first."""
        total = self._threads.total(pid)
        if total is None:
            return None
        now = time.monotonic()
        last = self._runq.get(pid)
        self._runq[pid] = (now, total)
        if last is None or now <= last[0]:
            return None
        return max(0.0, (total - last[1]) / 1e6 / (now - last[0]))

    def process_snapshot(self, rank: int, pid: int) -> ProcessSnapshot:
        """What psutil said of the process (its status, CPU since the last tick, resident
        memory, threads), from its stat and statm: psutil read stat twice, status and statm
        through its file objects."""
        if not procfs.PROCFS:
            return self._psutil_snapshot(rank, pid)
        try:
            state, ticks, started, threads, rss_pages = procfs.rank_stat(pid)
        except (FileNotFoundError, ProcessLookupError):
            self._procs.pop(pid, None)
            return ProcessSnapshot(rank, pid, False, GONE)
        except (PermissionError, ValueError, IndexError):
            return ProcessSnapshot(rank, pid, True, "unknown")
        status = _STATE.get(state, "?")
        if status in ("zombie", "dead"):
            self._threads.forget(pid)  # its threads have ended
            return ProcessSnapshot(rank, pid, False, status)
        now, last = time.monotonic(), self._procs.get(pid)
        self._procs[pid] = (started, ticks, now)
        cpu = None  # the first look at it (or at a new process under its pid) primes
        if last is not None and last[0] == started:
            cpu = _pct(ticks - last[1], now - last[2])
        return ProcessSnapshot(rank, pid, True, status, cpu, rss_pages * procfs.PAGE,
                               threads, self.runq_ms_per_s(pid))

    def _psutil_snapshot(self, rank: int, pid: int) -> ProcessSnapshot:
        proc = self._procs.get(pid)
        try:
            if proc is None or not proc.is_running():  # is_running also catches pid reuse
                proc = psutil.Process(pid)
                self._procs[pid] = proc
                proc.cpu_percent(interval=None)  # prime
                first = True
            else:
                first = False
            with proc.oneshot():
                status = _STATUS.get(proc.status(), str(proc.status()))
                if status in ("zombie", "dead"):
                    return ProcessSnapshot(rank, pid, False, status)
                cpu = None if first else proc.cpu_percent(interval=None)
                return ProcessSnapshot(rank, pid, True, status, cpu, proc.memory_info().rss,
                                       proc.num_threads(), self.runq_ms_per_s(pid))
        except psutil.ZombieProcess:
            return ProcessSnapshot(rank, pid, False, "zombie")
        except psutil.NoSuchProcess:
            self._procs.pop(pid, None)
            return ProcessSnapshot(rank, pid, False, GONE)
        except psutil.AccessDenied:
            return ProcessSnapshot(rank, pid, True, "unknown")

    def processes(self, rank_pids: dict[int, int]) -> tuple[ProcessSnapshot, ...]:
        snaps = tuple(self.process_snapshot(r, p) for r, p in sorted(rank_pids.items()))
        self._ranks_cpu_pct = sum(p.cpu_pct or 0.0 for p in snaps)
        live = set(rank_pids.values())
        for pid in [p for p in self._procs if p not in live]:
            del self._procs[pid]
            self._runq.pop(pid, None)
        self._threads.retain(live)
        return snaps

    def close(self) -> None:
        """Close the rank threads' files kept open between ticks."""
        self._threads.retain(())


def _psutil_memory() -> tuple[int, int]:
    vm = psutil.virtual_memory()
    return vm.total, vm.available


def _psutil_net() -> tuple[int, int] | None:
    net = psutil.net_io_counters()
    return (net.bytes_sent, net.bytes_recv) if net else None


def _psutil_cpu() -> tuple[float, float | None]:
    try:
        steal = getattr(psutil.cpu_times_percent(interval=None), "steal", None)
    except Exception:
        steal = None
    return psutil.cpu_percent(interval=None), steal


def process_alive(pid: int) -> bool:
    """True when `pid` exists and is not a zombie."""
    try:
        return psutil.Process(pid).status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    except psutil.AccessDenied:
        return True


def _descends(pid: int, ancestors: set, parents: dict[int, int]) -> bool:
    """`pid` is one of `ancestors` or below one of them."""
    for _ in range(64):
        if pid in ancestors:
            return True
        pid = parents.get(pid, 0)
        if pid <= 1:
            return False
    return False


def _pct(ticks: int, seconds: float) -> float:
    """A process' CPU over an interval, % of one core (psutil's cpu_percent)."""
    return round(ticks / procfs.CLK_TCK / seconds * 100, 1) if seconds > 0 else 0.0


class _Proc:
    """A busy process as _by_program reads it (pid, name, cores): psutil is asked once it
    is named, a few processes a tick, not every process of the machine."""

    __slots__ = ("pid", "_proc")

    def __init__(self, pid: int):
        self.pid, self._proc = pid, None

    def _p(self) -> psutil.Process:
        if self._proc is None:
            self._proc = psutil.Process(self.pid)
        return self._proc

    def name(self) -> str:
        return self._p().name()

    def cpu_affinity(self):
        return self._p().cpu_affinity()


def _by_program(found: list, parents: dict[int, int]) -> tuple:
    """(process, cpu %) pairs -> one entry per program, busiest first: processes of one
    name and one parent (a pool of workers) are one program; unrelated processes that
    share a name (every `python`) stay apart."""
    groups: dict[tuple, list] = {}
    for proc, pct in sorted(found, key=lambda pp: -pp[1]):
        try:
            name = proc.name()
        except psutil.Error:
            continue
        groups.setdefault((name, parents.get(proc.pid, 0)), []).append((proc, pct))
    out = []
    for (name, _), members in groups.items():
        top = members[0][0]
        try:
            cpus = sorted(top.cpu_affinity())
        except (AttributeError, psutil.Error):
            cpus = None
        out.append({"name": name, "pid": top.pid, "pids": [p.pid for p, _ in members[:8]],
                    "count": len(members), "cpu_pct": round(sum(x for _, x in members), 1),
                    "cpus": cpus})
    out.sort(key=lambda b: -b["cpu_pct"])
    return tuple(out)
