"""Host probe (psutil): the node's CPU, load, memory and network, and each rank process's
liveness, state, CPU and resident memory. Snapshots are immutable; a probe keeps its
`psutil.Process` objects between ticks so CPU percentages cover the time since the last one.
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass, fields

import psutil

# psutil status -> the few states a person needs
_STATUS = {psutil.STATUS_RUNNING: "running", psutil.STATUS_SLEEPING: "sleeping",
           psutil.STATUS_DISK_SLEEP: "disk-sleep", psutil.STATUS_STOPPED: "stopped",
           psutil.STATUS_TRACING_STOP: "stopped", psutil.STATUS_ZOMBIE: "zombie",
           psutil.STATUS_DEAD: "dead", psutil.STATUS_IDLE: "sleeping"}
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

    def to_json(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, d: dict) -> ProcessSnapshot:
        return cls(**{f.name: d.get(f.name) for f in fields(cls)})


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

    def to_json(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, d: dict) -> HostSnapshot:
        return cls(**{f.name: d.get(f.name) for f in fields(cls)})


class HostProbe:
    def __init__(self):
        self.host = socket.gethostname()
        self._procs: dict[int, psutil.Process] = {}
        psutil.cpu_percent(interval=None)  # prime: the first real reading covers a tick

    def host_snapshot(self) -> HostSnapshot:
        try:
            load = os.getloadavg()
        except (OSError, AttributeError):
            load = (None, None, None)
        try:
            vm = psutil.virtual_memory()
            total, avail = vm.total, vm.available
        except Exception:
            total = avail = None
        try:
            net = psutil.net_io_counters()
            sent, recv = (net.bytes_sent, net.bytes_recv) if net else (None, None)
        except Exception:
            sent = recv = None
        return HostSnapshot(t=time.time(), host=self.host,
                            cpu_pct=psutil.cpu_percent(interval=None),
                            cpu_count=psutil.cpu_count(), load1=load[0], load5=load[1],
                            load15=load[2], mem_total_bytes=total, mem_available_bytes=avail,
                            net_sent_bytes=sent, net_recv_bytes=recv)

    def process_snapshot(self, rank: int, pid: int) -> ProcessSnapshot:
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
                                       proc.num_threads())
        except psutil.ZombieProcess:
            return ProcessSnapshot(rank, pid, False, "zombie")
        except psutil.NoSuchProcess:
            self._procs.pop(pid, None)
            return ProcessSnapshot(rank, pid, False, GONE)
        except psutil.AccessDenied:
            return ProcessSnapshot(rank, pid, True, "unknown")

    def processes(self, rank_pids: dict[int, int]) -> tuple[ProcessSnapshot, ...]:
        snaps = tuple(self.process_snapshot(r, p) for r, p in sorted(rank_pids.items()))
        live = set(rank_pids.values())
        for pid in [p for p in self._procs if p not in live]:
            del self._procs[pid]
        return snaps


def process_alive(pid: int) -> bool:
    """True when `pid` exists and is not a zombie."""
    try:
        return psutil.Process(pid).status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    except psutil.AccessDenied:
        return True
