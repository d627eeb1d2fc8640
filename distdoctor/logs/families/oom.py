"""Out of memory: CUDA's allocator (which rank, which GPU, requested vs free), and the host's
OOM killer (a SIGKILL with no traceback; the kernel's and Slurm's own words when present)."""

from __future__ import annotations

import re

from distdoctor.findings import Finding
from distdoctor.logs import remedies as R
from distdoctor.logs.bounds import small_int
from distdoctor.logs.lines import LogLine
from distdoctor.logs.problems import Problem, on
from distdoctor.logs.signals import CAUSE, Family, Signal, rule, then

NAME = "oom"

_SIZE = r"[\d.]+ ?[KMGTP]i?B"
# c10/cuda/CUDACachingAllocator.cpp: "Tried to allocate 2.00 GiB. GPU 3 has a total capacity
# of 79.14 GiB of which 1.06 GiB is free." (2.1+); before: "(GPU 0; 39.59 GiB total capacity;
# 37.12 GiB already allocated; 1.06 GiB free; ...)"
_ASK = re.compile(rf"Tried to allocate (?P<requested>{_SIZE})")
_GPU_NEW = re.compile(rf"GPU (?P<gpu>\d+) has a total capacity of (?P<total>{_SIZE}) of which "
                      rf"(?P<free>{_SIZE}) is free")
_GPU_OLD = re.compile(rf"\(GPU (?P<gpu>\d+); (?P<total>{_SIZE}) total capacity;.*?"
                      rf"(?P<free>{_SIZE}) free")
_CUDA_OOM = re.compile(r"CUDA out of memory|HIP out of memory|CUDA error: out of memory|"
                       r"Cuda failure (?:2 )?'out of memory'|cudaErrorMemoryAllocation")

# a shell's word for its child's SIGKILL ("Killed", "./run.sh: line 2:  7953 Killed  python x")
SHELL_KILLED = re.compile(r"^(?:\S+: line \d+: +\d+ )?Killed(?:\s+\S.*)?$")

RULES = (
    rule("host_oom", NAME, CAUSE,
         r"Out of memory: Kill(?:ed)? process (?P<pid>\d+)|oom[-_]kill(?:er)? event|"
         r"killed by the cgroup out-of-memory handler|oom-kill:", ints=("pid",)),
    rule("host_oom", NAME, CAUSE, SHELL_KILLED.pattern),
    rule("dataloader_killed", NAME, CAUSE,
         r"DataLoader worker \(pid (?P<pid>\d+)\) is killed by signal: Killed",
         ints=("pid",)),
    # a DataLoader worker's SIGBUS: /dev/shm (Docker's default 64 MB) is full
    rule("shm_bus_error", NAME, CAUSE,
         then(r"[Bb]us error") + r"insufficient shared memory|"
         r"insufficient shared memory \(shm\)"),
    rule("host_alloc_failed", NAME, CAUSE,
         then(r"DefaultCPUAllocator: (?:can't|not enough memory)") + r"(?:allocate|alloc) "
         r"(?P<requested>\d+) bytes", ints=("requested",)),
)


class OomFamily(Family):
    name = NAME
    anchors = (b"out of memory", b"Out of memory", b"oom", b"is killed by signal",
               b"DefaultCPUAllocator", b"cudaErrorMemoryAllocation", b"shared memory", b"Killed")
    rules = RULES

    def feed(self, line: LogLine) -> list[Signal]:
        text = line.text
        if _CUDA_OOM.search(text):
            f = {}
            for rx in (_ASK, _GPU_NEW, _GPU_OLD):
                if m := rx.search(text):
                    f.update({k: v for k, v in m.groupdict().items() if v})
            if "gpu" in f:
                f["gpu"] = small_int(f["gpu"])
                if f["gpu"] is None:
                    del f["gpu"]
            return [Signal("cuda_oom", NAME, CAUSE, line, f)]
        out = super().feed(line)
        if out and "StepId=" in text:  # slurmstepd's: srun's label on it is a task, not a rank
            out[0].fields["step_task"] = line.rank
            line.rank = None
        return out


# --- what its problems mean ---------------------------------------------------------------
_HOST = {"host_oom": "the host's OOM killer killed a process",
         "dataloader_killed": "a DataLoader worker was killed (SIGKILL): host out of memory",
         "host_alloc_failed": "host memory exhausted (CPU allocation failed)"}


def describe(p: Problem, ctx) -> Finding:
    f, ranks = p.first.fields, sorted(p.ranks)
    if p.rule == "cuda_oom":
        if not ranks and (r := _next_rank(p.first.line, ctx)) is not None:
            ranks = [r]
        gpu = f" on GPU {f['gpu']}" if "gpu" in f else ""
        ask = f": tried to allocate {f['requested']}" if "requested" in f else ""
        free = f" with {f['free']} free of {f['total']}" if "free" in f else ""
        return ctx.finding(p, "crash", "error", f"CUDA out of memory{on(ranks)}{gpu}{ask}{free}",
                           ranks, R.CUDA_OOM)
    if p.rule == "shm_bus_error":
        return ctx.finding(p, "crash", "error", f"a DataLoader worker hit a bus error: /dev/shm "
                           f"is too small{on(ranks)}", ranks, R.SHM_DATALOADER)
    task = p.field("step_task")
    if task is not None and not ranks:  # Slurm's cgroup: the rank is the launcher's to say
        killed = [e for e in ctx.exits.values() if e.get("signum") == 9]
        ranks = [killed[0]["rank"]] if len(killed) == 1 and killed[0]["rank"] >= 0 else []
        who = (f" (srun task {task}'s node" + (f", local rank {killed[0]['local_rank']})"
                                                if len(killed) == 1 and "local_rank" in
                                                killed[0] else ")"))
        return ctx.finding(p, "crash", "error", f"Slurm's cgroup OOM handler killed a process "
                           f"(SIGKILL){on(ranks)}{who}", ranks, R.HOST_OOM)
    return ctx.finding(p, "crash", "error", f"{_HOST[p.rule]}{on(ranks)}", ranks, R.HOST_OOM)


def _next_rank(line, ctx) -> int | None:
    """An unlabelled OOM line printed right before one rank's labelled lines begin (torch
    writes the exception, then the launcher's prefixed copy of its traceback): that rank's."""
    after = [w[1] for w, a in ctx.ev.activity.items() if w and w[0] == "rank"
             and a.first_file == line.file and a.first_lineno == line.lineno + 1]
    return after[0] if len(after) == 1 else None
