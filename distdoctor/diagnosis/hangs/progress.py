"""Is a rank that others wait for making progress? The evidence, and the verdict.

A hang is a rank that stopped making progress while others wait for it, not a wait
longer than a number. Evidence is what `distdoctor run` reads cheaply from outside the
rank (probes/progress.py: the main thread's CPU time and run-queue wait, the CPU time of
the rank's threads and child processes such as DataLoader workers, their I/O, threads
in disk sleep) and what the tracer already writes (its sampler's line of the main
thread, its heartbeat). Nothing here touches the ranks.

The rule (the `auto` policy; docs/hangs.md):
- idle (no CPU, no I/O) for STALL_S while others wait: a hang, named at once;
- busy on one sampled line with no I/O, its other threads idle, for SPIN_S: a hang (a
  loop that never ends), once two stacks of it a second apart agree (engine/waits.py);
- busy otherwise: a long wait, a state shown live and never an error; it escalates to a
  hang only past what this job has shown normal at that call site (LONG_FACTOR x the
  longest completed wait there, at least LONG_FLOOR_S);
- waiting for its DataLoader (the tracer's "data" span): a long wait for DATA_IDLE_S
  even when the workers look idle (a slow or remote source);
- no evidence at all (a rank on another node without a digest of its own): the fixed
  rule at FALLBACK_S.
`--hang-timeout S` replaces all of it with the fixed rule (`Policy(fixed_s=S)`).
"""

from __future__ import annotations

import os
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the probes are optional: the readings come from whoever has them
    from distdoctor.probes.progress import Reading


def _env_s(name: str, default: float) -> float:
    try:
        return max(1.0, float(os.environ.get(name, default)))
    except ValueError:
        return default


STALL_S = 5.0  # idle this long while others wait: a hang
# busy on one line, no I/O, this long: a hang (DISTDOCTOR_SPIN_S: tests scale it down)
SPIN_S = _env_s("DISTDOCTOR_SPIN_S", 30.0)
DATA_IDLE_S = 60.0  # a rank waiting for its DataLoader gets this long idle
LONG_FLOOR_S = 300.0  # a busy long wait escalates no sooner than this...
LONG_FACTOR = 4.0  # ... nor before this many times the longest seen at its call site
FALLBACK_S = 60.0  # no evidence of a rank's progress: the old fixed rule
CONFIRM_S = 2.0  # a wait cycle or a rank left alone must last this long (log lag)
ALL_JOINED_FLOOR_S = 30.0  # every member inside, none done: at least this long...
ALL_JOINED_FACTOR = 10.0  # ... and this many times the longest seen at that call site
LONG_WAIT_MIN_S = 10.0  # a completed wait this long is reported as a long wait

BUSY_CPU = 0.15  # of one core, main thread: it computes
BUSY_WANT = 0.6  # CPU + run-queue wait of the main thread: it would compute if it could
BUSY_TREE = 0.3  # of one core, all threads and child processes (DataLoader workers)
IO_MIN_BPS = 256 * 1024  # bytes a second read or written: it does I/O
KEEP_S = 60.0  # readings kept per rank
AUTO = "auto"  # `--hang-timeout auto`: the rule above


def hang_timeout_s(value: float | str | None, default: float | None = None) -> float | None:
    """The timeout a --hang-timeout value means: None for auto (by progress)."""
    if value is None:
        return default
    return None if value == AUTO else float(value)


@dataclass(frozen=True)
class Progress:
    """What the readings say about a rank now."""

    known: bool  # any readings at all
    busy: bool  # active in the newest interval
    idle_s: float  # seconds since it was last active (0 when active now)
    io_s: float  # seconds since it last did I/O (inf: none seen)
    evidence: str  # for people: "busy: 94% CPU, writing 1.1 GB/s"
    helpers: float = 0.0  # CPU (cores) of its other threads and children, newest interval


UNKNOWN = Progress(False, False, 0.0, float("inf"), "no readings of its process")


class ProgressTracker:
    """Readings per rank, and the verdict on them (no I/O of its own)."""

    def __init__(self):
        self.readings: dict[int, deque[Reading]] = {}

    def add(self, rank: int, r: Reading) -> None:
        q = self.readings.setdefault(rank, deque(maxlen=512))
        if q and r.t <= q[-1].t:
            return
        q.append(r)
        while len(q) > 2 and r.t - q[0].t > KEEP_S:
            q.popleft()

    def forget(self, rank: int) -> None:
        self.readings.pop(rank, None)

    def progress(self, rank: int) -> Progress:
        q = self.readings.get(rank)
        if not q or len(q) < 2:
            return UNKNOWN
        last_active = last_io = None
        newest = None
        for a, b in zip(list(q)[:-1], list(q)[1:], strict=True):
            dt = b.t - a.t
            if dt <= 0:
                continue
            cpu = (b.cpu_s - a.cpu_s) / dt
            want = cpu + (b.runq_s - a.runq_s) / dt
            tree = (b.tree_cpu_s - a.tree_cpu_s) / dt
            io = (b.io_bytes - a.io_bytes) / dt
            did_io = io >= IO_MIN_BPS or b.disk_wait
            active = cpu >= BUSY_CPU or want >= BUSY_WANT or tree >= BUSY_TREE or did_io
            if active:
                last_active = b.t
            if did_io:
                last_io = b.t
            newest = (cpu, want, tree, io, b.disk_wait, active)
        now = q[-1].t
        first = q[0].t
        cpu, want, tree, io, disk, active = newest or (0, 0, 0, 0, False, False)
        parts = [f"{cpu * 100:.0f}% CPU"]
        if want - cpu >= 0.1:
            parts.append(f"{(want - cpu) * 100:.0f}% waiting for a CPU")
        if tree - cpu >= 0.1:
            parts.append(f"{tree * 100:.0f}% CPU with its threads and workers")
        if io >= IO_MIN_BPS:
            parts.append(f"{_rate(io)} of I/O")
        if disk:
            parts.append("in disk wait")
        return Progress(True, active, 0.0 if active else now - (last_active or first),
                        float("inf") if last_io is None else now - last_io,
                        ("busy: " if active else "idle: ") + ", ".join(parts),
                        max(0.0, tree - cpu))


def _rate(bps: float) -> str:
    for unit, size in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if bps >= size:
            return f"{bps / size:.1f} {unit}"
    return f"{bps:.0f} B/s"


@dataclass(frozen=True)
class Verdict:
    state: str  # "hang" | "long_wait" | "pending" (not decided yet)
    why: str  # for people
    spin: bool = False  # a hang by the busy-on-one-line rule: its full stack confirms it


class Policy:
    """How a wait becomes a hang: by progress (`fixed_s=None`, the default) or by the
    fixed number of seconds `--hang-timeout S` gives."""

    def __init__(self, fixed_s: float | None = None, postmortem: bool = False):
        self.fixed_s = fixed_s
        # post-mortem there are no readings of the processes: the sampled lines in the
        # log decide (a wait still open when the log ends, the line not moving: a hang)
        self.postmortem = postmortem

    @property
    def auto(self) -> bool:
        return self.fixed_s is None

    def judge(self, waited_s: float, p: Progress, fixed_line_s: float | None,
              in_data: bool, normal_s: float | None) -> Verdict:
        """The rank others have waited for `waited_s`: `p` its progress, `fixed_line_s`
        how long its sampled line has not moved (None: no samples), `in_data` whether it
        waits for its DataLoader, `normal_s` the longest completed wait at this call site
        (None: the first)."""
        if self.fixed_s is not None:
            if waited_s >= self.fixed_s:
                return Verdict("hang", f"waited {waited_s:.0f} s >= --hang-timeout "
                               f"{self.fixed_s:g} s")
            return Verdict("pending", "")
        if not p.known:
            if fixed_line_s is not None and fixed_line_s < STALL_S:
                return Verdict("long_wait", "its sampled line moves")
            # (a rank's clock is known post-mortem only to its last heartbeat, 1 s apart)
            if self.postmortem and waited_s >= STALL_S - 1.5:
                return Verdict("hang", f"still waited for when the log ends, "
                               f"{waited_s:.0f} s, its sampled line not moving")
            if waited_s >= FALLBACK_S:
                return Verdict("hang", f"no evidence of progress; waited {waited_s:.0f} s")
            return Verdict("pending", "")
        if not p.busy:
            idle = min(p.idle_s, waited_s)
            if in_data:
                if idle >= DATA_IDLE_S:
                    return Verdict("hang", f"waiting for its DataLoader, idle {idle:.0f} s")
                return Verdict("long_wait", "waiting for its DataLoader")
            if idle >= STALL_S:
                return Verdict("hang", f"no progress for {idle:.0f} s ({p.evidence})")
            return Verdict("pending", "")
        if (fixed_line_s is not None and min(fixed_line_s, waited_s) >= SPIN_S
                and p.io_s >= SPIN_S and p.helpers < BUSY_TREE):
            return Verdict("hang", f"busy on one line for {fixed_line_s:.0f} s with no "
                           f"I/O ({p.evidence}): a loop that does not end", spin=True)
        bound = max(LONG_FLOOR_S, LONG_FACTOR * normal_s) if normal_s else None
        if bound is not None and waited_s >= bound:
            return Verdict("hang", f"busy, but it has kept the others waiting "
                           f"{waited_s:.0f} s, over {LONG_FACTOR:g}x the longest wait this "
                           f"job showed at this call site ({normal_s:.0f} s)")
        return Verdict("long_wait", p.evidence)

    def all_joined_bound(self, normal_s: float | None) -> float:
        """Every member inside a collective, none done: how long before it is a hang."""
        if self.fixed_s is not None:
            return self.fixed_s
        return max(ALL_JOINED_FLOOR_S, ALL_JOINED_FACTOR * (normal_s or 0.0))

    def confirm_s(self) -> float:
        """A wait-for cycle (or a rank left alone) must last this long to be reported."""
        return self.fixed_s if self.fixed_s is not None else CONFIRM_S
