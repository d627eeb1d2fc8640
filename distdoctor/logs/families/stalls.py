"""Stalls told only by INFO and WARNING lines, before any error: a job that will die at its
timeout, said while it still waits.

- c10d's store-based barrier (init_process_group / new_group with TORCH_DIST_INIT_BARRIER=1,
  and torch before 2.0 always) logs every 10 s while fewer ranks than the world checked in:
  `Waiting in store based barrier to initialize process group for [N seconds]rank: R, key: K
  (world_size=W, worker_count|num_workers_joined=J, timeout=T ...)`. A wait whose count is
  still below the world where the log ends (no `Completed store-based barrier` for its key) is
  a stall: J of W arrived, waited so long, T ahead.
- c10d's socket layer: `[c10d] waitForInput: socket SocketImpl(..., remote=HOST:PORT) timed
  out after Nms`: a store client waited N ms for the store's answer. Said as the stall, on
  the ranks that waited, naming the store, where the log does not go on to the store's own
  error (which names the key: store.py's); a traceback cut off after it is its consequence.
- A line repeated by a waiting runtime with nothing moving (vLLM's `No available shared memory
  broadcast block found in 60 seconds`): said with the number of repeats and the time.

Which ranks never arrived is not in any of these lines: they are counts, never blame.
"""

from __future__ import annotations

import re

from distdoctor.findings import Finding
from distdoctor.logs import remedies as R
from distdoctor.logs.bounds import small_int
from distdoctor.logs.lines import LogLine
from distdoctor.logs.problems import Problem, clip, plural, ranks_text
from distdoctor.logs.signals import CAUSE, Family, Signal, then

NAME = "stall"

_BARRIER_WAIT = re.compile(
    r"Waiting in store based barrier to initialize process group for "
    r"(?:(?P<secs>\d{1,12}(?:\.\d+)?) seconds ?)?rank:? (?P<rank>\d+), key: ?(?P<key>[^\s,(]+)"
    r"(?: \(world_size=(?P<world>\d+), (?:worker_count|num_workers_joined)=(?P<joined>\d+)"
    r"(?:, timeout=(?P<timeout>\d+ days?, [\d:.]+|[\d:.]+))?)?")
# the barrier done, or given up (its timeout error is the store family's: the wait is over)
_BARRIER_DONE = re.compile(r"(?:Completed store-based barrier|Timed out initializing process "
                           r"group in store based barrier on rank:? \d+,) for key: ?(?P<key>[^\s,]+)")
_WAIT_INPUT = re.compile(
    then("waitForInput: socket ") + r"remote=\[?(?P<host>[^\]\s,)]+)\]?:(?P<port>\d+)\)? timed out "
    r"after (?P<ms>\d+)ms")
# the error a timed-out store read raises next, when the log shows it (store.py reads it)
_STORE_ERROR = re.compile(r"DistStoreError|DistNetworkError|[Ww]ait timeout|Socket Timeout|"
                          r"[Tt]imeout waiting for key")
_SHM_WAIT = re.compile(r"No available shared memory broadcast block found in (?P<secs>\d+) sec")
_CLOCK = re.compile(r"(\d\d):(\d\d):(\d\d)")
MAX_OPEN = 10_000


class StallFamily(Family):
    name = NAME
    anchors = (b"store based barrier", b"Completed store", b"waitForInput",
               b"No available shared memory broadcast", b"DistStoreError", b"DistNetworkError",
               b"wait timeout", b"Wait timeout", b"Socket Timeout", b"imeout waiting for key")

    def __init__(self):
        self._barriers: dict[str, list] = {}  # key -> [first wait, last wait, waits]
        self._waits = 0
        self._shm: list[Signal] = []
        self._inputs: dict[object, Signal] = {}  # per process: its waitForInput timeout

    def feed(self, line: LogLine) -> list[Signal]:
        text = line.text
        if m := _WAIT_INPUT.search(text):
            f = {"host": m["host"], "port": small_int(m["port"]), "ms": small_int(m["ms"])}
            if None not in f.values() and len(self._inputs) < MAX_OPEN:
                self._inputs.setdefault(line.who, Signal("store_input_timeout", NAME, CAUSE,
                                                         line, f))
            return []
        if m := _BARRIER_DONE.search(text):
            self._barriers.pop(m["key"], None)
            return []
        if m := _BARRIER_WAIT.search(text):
            f = {k: v for k, v in m.groupdict().items() if v is not None}
            for k in ("rank", "world", "joined"):
                if k in f:
                    f[k] = small_int(f[k])
                    if f[k] is None:
                        del f[k]
            if f.get("world") and f.get("joined", 0) >= f["world"]:
                self._barriers.pop(f["key"], None)  # everyone arrived
                return []
            held = self._barriers.get(f["key"])
            s = Signal("barrier_wait", NAME, CAUSE, line, f)
            if held is not None:
                held[1:] = [s, held[2] + 1]
            elif len(self._barriers) < MAX_OPEN:
                self._barriers[f["key"]] = [s, s, 1]
            return []
        if _STORE_ERROR.search(text):
            self._inputs.pop(line.who, None)  # the store's own error says more: its key
            return []
        if (m := _SHM_WAIT.search(text)) and (secs := small_int(m["secs"])) is not None:
            s = Signal("shm_wait", NAME, CAUSE, line, {"secs": secs})
            self._shm = self._shm[:1] + [s]
            self._waits += 1
            return []
        return []

    def pending(self) -> list[Signal]:
        """The barriers still short of the world where the log ends; a repeated wait."""
        out = list(self._inputs.values())
        for first, last, waits in self._barriers.values():
            f = dict(last.fields)
            f.update(waits=waits, waited=_waited(first, last))
            out.append(Signal("barrier_wait", NAME, CAUSE, first.line, f))
        if self._waits >= 2:
            first, last = self._shm[0], self._shm[-1]
            out.append(Signal("shm_wait", NAME, CAUSE, first.line, {
                "secs": first.fields["secs"], "waits": self._waits,
                "waited": _waited(first, last)}))
        return out


def _waited(first: Signal, last: Signal) -> float | None:
    """Seconds between two lines, from the waits' own count or their clocks."""
    if "secs" in last.fields and first.rule == "barrier_wait":
        return float(last.fields["secs"])
    a, b = _CLOCK.search(first.line.when or ""), _CLOCK.search(last.line.when or "")
    if not (a and b):
        return None
    t0, t1 = (int(x[1]) * 3600 + int(x[2]) * 60 + int(x[3]) for x in (a, b))
    return float((t1 - t0) % 86400)


def _time(secs: float | None) -> str:
    if secs is None:
        return ""
    return f"{secs / 60:.0f} min" if secs >= 600 else f"{secs:.0f} s"


def describe(p: Problem, ctx) -> Finding:
    f, reporters = p.fields(), sorted(p.ranks)
    on = f" on rank{plural(reporters)} {ranks_text(reporters)}" if reporters else ""
    if p.rule == "store_input_timeout":
        secs = f["ms"] / 1000
        return ctx.finding(p, "hang", "error", f"stall: a c10d store client{on} waited "
                           f"{_time(secs)} ({f['ms']}ms) for an answer from the store at "
                           f"{f['host']}:{f['port']} and timed out (waitForInput): the store or "
                           f"the rank that should write the key it waited for never answered",
                           [], R.STORE_KEY)
    if p.rule == "shm_wait":
        waited = f.get("waited")
        took = f" over {_time(waited)}" if waited else ""
        return ctx.finding(p, "hang", "error", f"stall: vLLM's shared-memory broadcast found no "
                           f"block in {f['secs']} seconds, {f.get('waits')} times in a row"
                           f"{took}{on}: a worker stopped reading (stuck or dead)", [],
                           R.FIND_LATE_RANK)
    if p.rule == "repeat_wait":
        return _repeat_wait(p, on, ctx)
    if not reporters and "rank" in f:
        on = f" on rank {f['rank']}"
    world, joined = f.get("world"), f.get("joined")
    count = f"{joined} of {world} ranks checked in" if world else "not every rank checked in"
    waited = f.get("waited")
    took = f", waited at least {_time(waited)} so far ({f.get('waits', 1)} waits logged)" \
        if waited else f" ({f.get('waits', 1)} waits logged)"
    ahead = f"; the job fails at the barrier's timeout {f['timeout']}" if "timeout" in f else ""
    missing = f" ({world - joined} missing; which ones the count does not say)" \
        if world and joined is not None else ""
    return ctx.finding(p, "hang", "error", f"stall: the store-based barrier of "
                       f"init_process_group/new_group (key {f.get('key')}) is stuck{on}: "
                       f"{count}{missing}{took}{ahead}", [], R.STORE_JOIN)


def _repeat_wait(p: Problem, on: str, ctx) -> Finding:
    """The stall no rule names (repeats.py): the log ends in one line, over and over."""
    last = p.signals[-1].fields
    waited = max((s.fields["waited"] or 0 for s in p.signals), default=0) or None
    repeats = max(s.fields["repeats"] for s in p.signals)
    took = f" over {_time(waited)}" if waited else " (the log shows no times)"
    severity = "error" if waited and waited >= 120 else "warning"
    return ctx.finding(p, "hang", severity, f"stall: the log ends in the same line {repeats} "
                       f"times{on}{took}, {clip(last['text'], 140)!r}, with nothing else printed "
                       f"and no number in it moving: the job waits for something that does not "
                       f"come", [], R.REPEAT_WAIT)
