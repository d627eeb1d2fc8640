"""Per-rank, per-step accounting: which step an op belongs to, and where the step went.

A step is, in order of preference:
- a span: the job's own (`distdoctor.trace("step")`, the reference trainer's "step 12") or
  the tracer's implicit ones (tracer/steps.py: optimizer step to optimizer step, else
  batch to batch). An op's `span_index` names it;
- in a job with no spans at all, one turn of the repeating pattern of the rank's
  collectives (its step thread's: a metrics thread beside it, on a group of its own,
  keeps its own cadence and is left out; beside.py): the shortest period p of their
  (group, op, line) sequence that holds over the last max(3p, MIN_PATTERN) of them (a
  loop with one all-reduce per iteration: p=1).
  Until a period is found, CHUNK collectives make a step.

Per step and rank: the wall time (the span's duration, or from one turn's first op to the
next's), the time in collectives (the rank's own waits), the time waiting for batches
(implicit "data" spans), compute as the rest, and where the main thread was between ops
(sample events: the innermost user line). Bounded: KEEP steps per rank.

`StepTimes` keeps this for every rank, fed by the engine in each rank's own order (spans,
samples, span-less collectives), and places each op whose rendezvous the straggler
tracker judges in its step. It knows nothing of the tracker, which reads it (straggler.py,
and cause.py, host_noise.py for a finding).
"""

from __future__ import annotations

from bisect import bisect_right
from collections import Counter, deque
from dataclasses import dataclass

from distdoctor.diagnosis.stragglers import drop_oldest
from distdoctor.diagnosis.stragglers.beside import StepThread
from distdoctor.runlog.run import span_name

CHUNK = 64  # collectives per step before a rank's pattern is known
MAX_PATTERN = 256  # collectives kept to find a rank's pattern
MIN_PATTERN = 24  # a period must hold over at least this many
KEEP = 160  # steps (and batch waits) per rank whose breakdown is kept
LOOSE_SAMPLES = 4096  # samples kept per rank outside any span (placed by time)
MAX_KEYS = 200_000  # span-less collectives given a step key, awaiting their rendezvous
PATTERN_BASE = 1_000_000  # a turn's key is -PATTERN_BASE - turn (the chunks' are above)


def find_period(sigs: list) -> int | None:
    """The shortest p such that the tail of `sigs` repeats with period p, checked over the
    last max(3p, MIN_PATTERN) entries; None if none does yet."""
    n = len(sigs)
    for p in range(1, n // 3 + 1):
        span = max(3 * p, MIN_PATTERN)
        if span > n:
            return None
        if all(sigs[n - i] == sigs[n - i - p] for i in range(1, span - p + 1)):
            return p
    return None


def _enclosing(function):
    """A generator expression, comprehension or lambda counts as the function around it
    (`f.<locals>.<genexpr>` -> `f`): the user wrote one function there."""
    if isinstance(function, str) and function.endswith(">") and ".<locals>.<" in function:
        return function.rsplit(".<locals>.", 1)[0]
    return function


class Pattern:
    """Step keys for a rank without spans (negative numbers: span keys are positive)."""

    # (slots: engine/_ingest.c reads and counts a found pattern's turns by offset)
    __slots__ = ("sigs", "period", "count", "start", "turns0")

    def __init__(self):
        self.sigs: list = []
        self.period: int | None = None
        self.count = 0  # collectives seen
        self.start = 0  # the count at which the period was found
        self.turns0 = 0  # turns given before the pattern was found anew (restart)

    def key(self, sig) -> int:
        self.count += 1
        if self.period is None:
            self.sigs.append(sig)
            if len(self.sigs) > MAX_PATTERN:
                del self.sigs[0]
            if self.count % 4 == 0:
                self.period = find_period(self.sigs)
                self.start = self.count
            if self.period is None:
                return -1 - (self.count - 1) // CHUNK
        return -PATTERN_BASE - self.turns0 - (self.count - self.start) // self.period

    def restart(self) -> None:
        """The rank's step thread changed (beside.py): the period is found anew, over the
        new thread's collectives; the keys go on after those given."""
        if self.period is not None:
            self.turns0 += (self.count - self.start) // self.period + 1
        self.sigs, self.period = [], None

    def label(self, key: int) -> str:
        """Which turn of the loop a key is, counted from the rank's first collective."""
        if key > -PATTERN_BASE:
            return f"collectives {(-1 - key) * CHUNK + 1}-{(-key) * CHUNK}"
        turn = -PATTERN_BASE - key
        if self.period and not self.turns0:
            turn += self.start // self.period
        return f"iteration {turn + 1}"


@dataclass(slots=True)
class StepTime:
    # one is made per step and rank (a loop of one collective per iteration: one per
    # collective), so its containers are made when first needed, not with it
    wall_ms: float | None = None
    coll_ms: float = 0.0
    data_ms: float = 0.0
    batches: int = 0
    first_enter_ns: int = 0
    label: str | None = None
    samples: Counter | None = None  # where the main thread was (site -> samples)
    runq_ms: float = 0.0  # waited for a CPU (the samples' run queue delays)
    by_group: dict | None = None  # group -> ms inside its collectives
    children: list | None = None  # its batch waits' keys (their samples)

    @property
    def compute_ms(self) -> float | None:
        if self.wall_ms is None:
            return None
        return max(0.0, self.wall_ms - self.coll_ms - self.data_ms)


class RankSteps:
    """One rank's recent steps (key -> StepTime), oldest first."""

    __slots__ = ("steps", "pattern", "sample_period_ms", "_last_sample_ns", "loose",
                 "group_desc", "_spans_done", "_turns")  # (read by offset: _ingest.c)

    def __init__(self):
        self.steps: dict[int, StepTime] = {}  # (oldest first)
        self.pattern = Pattern()
        self.sample_period_ms: float | None = None
        self._last_sample_ns = 0
        # (t_ns, site, run queue ms) outside any span
        self.loose: deque = deque(maxlen=LOOSE_SAMPLES)
        self.group_desc: dict[str, str] = {}  # its groups' descriptions ("mesh_tp")
        self._spans_done = 0  # finished step spans
        self._turns = 0  # turns of the pattern begun (span-less steps)

    @property
    def finished(self) -> int:
        """Steps the rank has finished: step spans ended, or turns of its pattern followed
        by the next one."""
        return self._spans_done + max(0, self._turns - 1)

    def get(self, key: int) -> StepTime:
        st = self.steps.get(key)
        if st is None:
            st = self.steps[key] = StepTime()
            if key < 0:
                self._turns += 1
            if len(self.steps) > KEEP:
                drop_oldest(self.steps)
        return st

    def collective(self, key: int, ev) -> None:
        st = self.steps.get(key) or self.get(key)
        ms = (ev.t_end_ns - ev.t_enter_ns) / 1e6
        st.coll_ms += ms
        group, by_group = ev.group, st.by_group
        if by_group is None:
            st.by_group = {group: ms}
        else:
            by_group[group] = by_group.get(group, 0.0) + ms
        if group not in self.group_desc:
            self.group_desc[group] = ev.group_desc
        if key < 0:  # a turn of the pattern: it runs from its first op to the next turn's
            if not st.first_enter_ns or ev.t_enter_ns < st.first_enter_ns:
                st.first_enter_ns = ev.t_enter_ns

    def span(self, ev) -> None:
        """A finished span: a step's wall time (any span that ops name), or a batch wait."""
        ms = (ev.t_end_ns - ev.t_enter_ns) / 1e6
        if ev.implicit and ev.name == "data":
            if ev.span_index:
                st = self.get(ev.span_index)
                st.data_ms += ms
                st.batches += 1
                if st.children is None:
                    st.children = []
                st.children.append(ev.index + 1)
            return
        st = self.get(ev.index + 1)
        st.wall_ms = ms
        st.label = span_name(ev)
        self._spans_done += 1

    def sample(self, ev) -> None:
        runq_ms = ev.numel_in / 1000 if ev.numel_in > 0 else 0.0
        if ev.callsite:
            site = (_enclosing(ev.callsite.get("function")), ev.callsite.get("file"),
                    ev.callsite.get("line"))
            if ev.span_index:
                st = self.get(ev.span_index)
                if st.samples is None:
                    st.samples = Counter()
                st.samples[site] += 1
                st.runq_ms += runq_ms
            else:
                self.loose.append((ev.t_enter_ns, site, runq_ms))
        if self._last_sample_ns:
            # the sampler's period: the shortest gap (a timer oversleeps, never under;
            # longer gaps are looks skipped inside collectives)
            gap = (ev.t_enter_ns - self._last_sample_ns) / 1e6
            if 0 < gap < (self.sample_period_ms or 1000):
                self.sample_period_ms = gap
        self._last_sample_ns = ev.t_enter_ns

    def label(self, key: int) -> str:
        st = self.steps.get(key)
        if st is not None and st.label:
            return st.label
        return self.pattern.label(key) if key < 0 else f"span {key}"

    def recent(self, last: int = 10) -> dict | None:
        """The breakdown of its last `last` finished steps (the newest keys hold the
        steps still open and their batch waits: twice as many are looked at)."""
        return self.breakdown(list(self.steps)[-2 * last:], with_samples=False)

    def breakdown(self, keys, with_samples: bool = True) -> dict | None:
        """Mean wall / collective / data / compute ms per step over `keys` (those with a
        known wall time), the CPU wait (run queue) in them, and (with_samples) the samples
        there (span-less steps' CPU wait is counted with their samples)."""
        for k in keys:
            st = self.steps.get(k)
            if st is not None and k < 0 and st.wall_ms is None and st.first_enter_ns:
                nxt = self.steps.get(k - 1)
                if nxt is not None and nxt.first_enter_ns:
                    st.wall_ms = (nxt.first_enter_ns - st.first_enter_ns) / 1e6
        rows = [self.steps[k] for k in keys if k in self.steps
                and self.steps[k].wall_ms is not None]
        if not rows:
            return None
        n = len(rows)
        by_group = Counter()
        for r in rows:
            if r.by_group:
                by_group.update(r.by_group)
        samples = Counter()
        runq_ms = sum(r.runq_ms for r in rows)
        for r in rows:
            for child in r.children or ():  # sampled while waiting for a batch
                if child in self.steps:
                    runq_ms += self.steps[child].runq_ms
                    if with_samples and self.steps[child].samples:
                        samples.update(self.steps[child].samples)
            if with_samples and r.samples:
                samples.update(r.samples)
        if self.loose and with_samples:  # no spans: a sample counts in the turn it fell in
            loose = list(self.loose)
            times = [t for t, _, _ in loose]
            for r in rows:
                if r.first_enter_ns:
                    lo = bisect_right(times, r.first_enter_ns)
                    hi = bisect_right(times, r.first_enter_ns + r.wall_ms * 1e6)
                    samples.update(site for _, site, _ in loose[lo:hi])
                    runq_ms += sum(q for _, _, q in loose[lo:hi])
        return {"steps": n,
                "wall_ms": sum(r.wall_ms for r in rows) / n,
                "collective_ms": sum(r.coll_ms for r in rows) / n,
                "data_ms": sum(r.data_ms for r in rows) / n,
                "batches": sum(r.batches for r in rows) / n,
                "compute_ms": sum(r.compute_ms for r in rows) / n,
                "runq_ms": runq_ms / n,
                "group_ms": {g: ms / n for g, ms in by_group.items()},
                "samples": samples, "samples_per_step": sum(samples.values()) / n}


def pattern_sig(ev) -> tuple:
    """What a collective is in its rank's repeating pattern: (group, op, line)."""
    return ev.group, ev.op, ev.callsite.get("line") if ev.callsite else None


class StepTimes:
    """Where every rank's steps go (rank -> RankSteps), and the step of each of its ops."""

    def __init__(self):
        self.ranks: dict[int, RankSteps] = {}
        # step keys of span-less collectives, given in each rank's own order (assign)
        self._keys: dict = {}  # (rank, event index) -> key, oldest first
        self._assigned: dict[int, int] = {}  # rank -> the last event index given a key
        self._turn: dict[int, int] = {}  # rank -> the step key of its latest collective
        self.thread = StepThread()  # which of its collectives are the step's (beside.py)

    def rank(self, rank: int) -> RankSteps:
        t = self.ranks.get(rank)
        if t is None:
            t = self.ranks[rank] = RankSteps()
        return t

    def span(self, ev) -> None:
        """A finished span of a rank: a step's wall time, or a batch wait."""
        self.rank(ev.rank).span(ev)

    def sample(self, ev) -> None:
        """Where a rank's main thread was between its ops."""
        self.rank(ev.rank).sample(ev)

    def assign(self, ev) -> None:
        """A collective, seen in its rank's own order (the engine's ingest): whether it is
        the step's (beside.py), and, with no span, its turn of the rank's repeating
        pattern, looked up when its rendezvous completes."""
        rank, index = ev.rank, ev.index
        assigned = self._assigned
        if index <= assigned.get(rank, -1):
            return  # seen before (this is its completion)
        assigned[rank] = index
        thread = self.thread
        before = thread.of.get(rank)
        if thread.op(ev) or ev.span_index:
            return  # a thread beside the step's; or its span is its step
        t = self.ranks.get(rank) or self.rank(rank)
        if before is not None and thread.of[rank] != before:
            t.pattern.restart()  # the step thread changed: its own pattern
        keys = self._keys
        cs = ev.callsite  # pattern_sig, inline
        key = keys[(rank, index)] = t.pattern.key(
            (ev.group, ev.op, cs.get("line") if cs else None))
        self._turn[rank] = key
        if len(keys) > MAX_KEYS:
            drop_oldest(keys)

    def place(self, rank: int, ev, p2p: bool) -> int:
        """The step of an op the straggler tracker judges, whose time counts in that
        step's collective time: its span; else, for a collective, its turn of the rank's
        pattern (given in its own order by assign), for a p2p op the turn of the rank's
        latest collective. (Once per member of every collective: written out inline.)"""
        t = self.ranks.get(rank) or self.rank(rank)
        key = ev.span_index
        if not key:
            if p2p:
                key = self._turn.get(rank, -1)
            else:
                key = self._keys.pop((rank, ev.index), None)
                if key is None:  # not seen through assign (a tracker fed rendezvous directly)
                    key = self._turn[rank] = t.pattern.key(pattern_sig(ev))
        t.collective(key, ev)
        return key
