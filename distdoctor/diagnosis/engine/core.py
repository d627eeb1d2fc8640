"""The diagnosis engine: event streams in, findings out; live and post-mortem alike.

Feed it events (new or updated) with `ingest`, rank liveness with `heartbeat` and
`exited`, then call `tick`: it returns the findings that are new or changed since the last
tick. Memory stays bounded: a rendezvous is dropped once every member has finished it
(after the straggler tracker has seen it), and the open ones are capped. Its mixins:
book.py (findings put, held, taken from the log, the final list), waits.py (the judgement
of waits) and hangs.py (the hang pass); what it keeps of each rank: ranks.py.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable
from dataclasses import replace

from distdoctor.diagnosis.crashes.crash import ExitInfo, crash_findings
from distdoctor.diagnosis.engine.book import FindingBook
from distdoctor.diagnosis.engine.boundary import Boundary, detector_of
from distdoctor.diagnosis.engine.fastpath import native_ingest
from distdoctor.diagnosis.engine.hangs import HangPass
from distdoctor.diagnosis.engine.ranks import RankState
from distdoctor.diagnosis.engine.waits import WaitJudge
from distdoctor.diagnosis.hangs.creations import is_creation
from distdoctor.diagnosis.hangs.group_order import GroupNames
from distdoctor.diagnosis.hangs.hang import RankView
from distdoctor.diagnosis.hangs.progress import Policy, ProgressTracker
from distdoctor.diagnosis.hangs.waits import Gaps
from distdoctor.diagnosis.mismatches.habits import Habits
from distdoctor.diagnosis.mismatches.mismatch import mismatch_finding, p2p_signature, signature
from distdoctor.diagnosis.mismatches.threads import ThreadUse
from distdoctor.diagnosis.parting.parted import explain_mismatch
from distdoctor.diagnosis.rendezvous import Rendezvous, key_of
from distdoctor.diagnosis.stragglers.steptime import StepTimes
from distdoctor.diagnosis.stragglers.straggler import StragglerTracker
from distdoctor.findings import Finding
from distdoctor.runlog.reader import Event
from distdoctor.runlog.run import span_name

# a step breakdown's numbers in a rank summary (RankSteps.recent)
SPLIT = ("steps", "wall_ms", "collective_ms", "data_ms", "compute_ms")

MAX_OPEN = 200_000  # open rendezvous kept; the oldest go first past this
MAX_SPANS = 4096  # span names remembered per rank
MAX_SAMPLES = 3600  # probe samples kept (an hour at 1 Hz on one node)
SETTLE_S = 1.0  # how long a disagreement waits for more ranks before it is reported
# how often the ranks' lateness is scored while a job runs: a straggler is a verdict over
# many steps, and scoring every rank on each pass (10 a second while ops flow) cost a
# tenth of the live diagnosis at 2 ranks x 1,000 collectives/s
SCORE_EVERY_S = 0.5
# the common event's ingest in C (_ingest.c: ingest_one's common path, the same objects)
_NATIVE = native_ingest(MAX_OPEN)


class Engine(FindingBook, WaitJudge, HangPass):
    def __init__(self, hang_timeout_s: float | None = 60.0, settle_s: float = SETTLE_S,
                 straggler_min_ms: float | None = None,
                 stacks: Callable[[list[int]], dict[int, str]] | None = None,
                 postmortem: bool = False):
        """`hang_timeout_s`: None decides hangs by progress (progress.Policy), a number
        by that fixed timeout (`--hang-timeout S`)."""
        self.hang_timeout_s = hang_timeout_s
        self.policy = Policy(hang_timeout_s, postmortem=postmortem)
        # readings of the ranks' processes (fed by the owner, `distdoctor run`), and
        # where each rank's main thread was between its ops (the tracer's samples)
        self.progress = ProgressTracker()
        self.gaps = Gaps()
        self.site_wait: dict[tuple, float] = {}  # call site -> longest completed wait
        self._now_s: float | None = None
        self._scored_s = -float("inf")  # engine clock of the last straggler scoring
        self._spin_stacks: dict[int, tuple[float, str]] = {}  # rank -> (when, stack)
        # read every local rank's progress, not only while some rank waits: a node that
        # sends digests, for a collector judging waits across nodes
        self.watch_all_progress = False
        self.settle_s = settle_s
        self.stacks = stacks
        self.open: dict[tuple, Rendezvous] = {}
        self.ranks: dict[int, RankState] = {}
        # where each rank's steps go (steptime.py), which the straggler tracker reads
        self.steptime = StepTimes()
        self.straggler = (StragglerTracker(steptime=self.steptime) if straggler_min_ms is None
                          else StragglerTracker(straggler_min_ms, steptime=self.steptime))
        self.found: dict[tuple, Finding] = {}  # engine key -> finding, in order found
        self._changed: list[Finding] = []
        self._mismatch_groups: dict[str, int] = {}  # group -> mismatches after the first
        self._errors: dict[str, list[Event]] = {}
        self._held: list[tuple[Finding, float | None]] = []  # (log mismatch, since): add_finding
        self.habits = Habits()  # what agreeing ranks do on each group
        self.thread_use = ThreadUse()  # groups that user threads take turns on
        # probe samples (GPU clocks, reasons) and the detector that joins them to the
        # stragglers: injected by the front end, so the engine does not import the probes
        self.samples: deque = deque(maxlen=MAX_SAMPLES)
        self.gpu_findings: Callable[[list, list[Finding]], list[Finding]] | None = None
        self.ingested = 0
        self.gpu_error: str | None = None
        # each detector behind a boundary: one that raises is said and left out
        self.boundary = Boundary(self._put)
        self.group_names = GroupNames()  # what each rank's group names stand for
        self._folded: dict[tuple, Finding] = {}  # hangs said inside a group-order cause
        # ranks whose clock is the engine's own (same host, CLOCK_MONOTONIC: the caller's
        # `now_s` is time.monotonic()); the others' "now" is estimated from heartbeats
        self.same_clock: set[int] = set()

    # --- input -------------------------------------------------------------------------
    def _rank(self, rank: int) -> RankState:
        st = self.ranks.get(rank)
        return st if st is not None else self.ranks.setdefault(rank, RankState(rank))

    def ingest(self, events, now_s: float) -> None:
        if _NATIVE is not None and type(events) is list:
            _NATIVE.ingest(self, events, now_s)  # (each event its own: _feed_failed)
            return
        for ev in events:
            try:
                self.ingest_one(ev, now_s)
            except Exception as exc:  # the engine's own part: that event is lost, not all
                self.boundary.failed("event ingest", exc, keep_on=True)

    def _feed_failed(self, exc: BaseException, default: str) -> None:
        """A detector's feed raised on one event (a `try` per feed: no call per event);
        also the C path's failures (_ingest.c: "waits", "event ingest" as said here)."""
        if not isinstance(exc, Exception):
            raise exc  # (an interrupt goes on up)
        if default in ("waits", "event ingest"):
            self.boundary.failed(default, exc, keep_on=True)
        else:
            self.boundary.failed(detector_of(exc, default), exc)

    def ingest_one(self, ev: Event, now_s: float) -> None:
        # Runs for every event of every rank (hundreds of thousands a second on a large
        # job): the common case, a collective, is written out inline.
        self.ingested += 1
        if ev.group_desc == "undefined":  # torch's name for a group made without a
            ev.group_desc = ""  # description: a word of its code, not of the job's
        st = self.ranks.get(ev.rank) or self._rank(ev.rank)
        if not st.max_t_ns:  # its first event read: whether its log lost its oldest ones
            self.group_names.began(ev.rank, ev.index)
        t_end, kind = ev.t_end_ns, ev.kind
        t = t_end or ev.t_enter_ns
        if t > st.max_t_ns:
            st.max_t_ns = t
        if kind == "span":
            if is_creation(ev):
                return self.group_names.created(ev)
            name = span_name(ev)
            if len(st.spans) < MAX_SPANS:
                st.spans[ev.index + 1] = name
            if st.latest is None or ev.index > st.latest.index:
                st.newest_span = name
                st.span_open = t_end is None
            try:
                if t_end is not None:  # a step's wall time, or a batch wait (steptime.py)
                    self.steptime.span(ev)
            except Exception as exc:
                self._feed_failed(exc, "step times")
            return
        if kind == "sample":  # where the main thread was between ops: for stragglers
            try:
                self.steptime.sample(ev)
                self.gaps.sample(ev.rank, ev.callsite, ev.t_enter_ns)
            except Exception as exc:
                self._feed_failed(exc, "step times")
            return
        straggler = self.straggler
        # its activity: how long its p2p ops blocked it (kept from a rank's first p2p op
        # on, so a job of collectives only skips the call)
        if kind == "p2p" or straggler.activity.times:
            try:
                straggler.op(ev)
            except Exception as exc:
                self._feed_failed(exc, "straggler")
        latest = st.latest
        if latest is None or ev.index >= latest.index:
            if latest is None or ev.index > latest.index:
                st.recent.append(ev)
                try:
                    self.gaps.op(ev.rank, ev.index)
                    if kind == "collective":
                        self.thread_use.op(ev, st.recent)
                except Exception as exc:
                    self._feed_failed(exc, "threads")
            st.latest = ev
        if t_end is not None:
            if st.last_done is None or ev.index >= st.last_done.index:
                st.last_done = ev
            tally = st.completed.get((ev.group, ev.group_desc, ev.op))
            if tally is None:
                tally = st.completed[(ev.group, ev.group_desc, ev.op)] = [0, 0.0]
            tally[0] += 1
            tally[1] += (t_end - ev.t_enter_ns) / 1e9
            if ev.status != "ok":
                # one finding per kind of error, not per port number or address
                text = re.sub(r"\d+", "N", ev.error or ev.status)
                self._errors.setdefault(text, []).append(ev)
        if kind == "collective":
            try:  # its step, from the rank's own order of collectives (steptime.py)
                self.steptime.assign(ev)
            except Exception as exc:
                self._feed_failed(exc, "step times")
            group, seq = ev.group, ev.seq
            if st.issued.get(group, 0) <= seq:
                st.issued[group] = seq + 1
            key = ("c", group, seq)
        else:
            key = key_of(ev)
            if key is None:
                return
        # one rendezvous is one name and one member list (group_order.py)
        name = st.names.get(ev.group)
        if name is None or (name[0] is not ev.group_ranks and name[0] != ev.group_ranks):
            name = st.names[ev.group] = (ev.group_ranks, self.group_names.variant(
                ev.group, ev.group_ranks, ev.rank, ev.callsite))
        if name[1]:
            key = (*key, name[1])
        rv = self.open.get(key)
        if rv is None:
            if len(self.open) >= MAX_OPEN:
                del self.open[next(iter(self.open))]
            rv = self.open[key] = Rendezvous.open(key, ev, now_s)
        if rv.arrive(ev):  # a completion update has the signature it had in flight
            # the raw fields first: equal raw fields mean equal signatures (the usual case),
            # and the signatures are made only where they differ
            raw = (ev.op, ev.numel_in, ev.numel_out, ev.dtypes, ev.reduce_op, ev.peer)
            if rv.first_raw is None:
                rv.first_raw = raw
            elif raw != rv.first_raw and rv.mismatch_since_s is None:
                sign = p2p_signature if key[0] == "p" else signature
                if rv.first_sig is None:  # the first arrival's (a completion keeps it)
                    rv.first_sig = sign(next(iter(rv.arrivals.values())))
                if sign(ev) != rv.first_sig:
                    rv.mismatch_since_s = now_s
        if rv.done >= len(rv.members) and rv.complete:
            del self.open[key]
            try:
                straggler.observe(rv)
            except Exception as exc:
                self._feed_failed(exc, "straggler")
            if "waits" not in self.boundary.off:  # boundary.call, without its frame
                try:
                    self._completed(rv)
                except Exception as exc:
                    self.boundary.failed("waits", exc, keep_on=True)
            if rv.mismatch_since_s is not None:
                self._report_mismatch(rv)
            elif key[0] != "p":  # not p2p
                self.habits.agreed(rv)

    def heartbeat(self, rank: int, hb_ns: int, now_s: float) -> None:
        st = self._rank(rank)
        if st.hb_seen_s is None or (hb_ns and hb_ns != st.hb_ns):  # first sight, or news
            st.hb_ns, st.hb_seen_s = hb_ns or st.hb_ns, now_s

    def heartbeat_age_s(self, rank: int, now_s: float) -> float | None:
        """How old the rank's newest heartbeat is: exact for a rank on the engine's own
        clock, else the time since it was seen to change; None before any was seen."""
        st = self.ranks.get(rank)
        if st is None:
            return None
        if rank in self.same_clock and st.hb_ns:
            return now_s - st.hb_ns / 1e9
        return None if st.hb_seen_s is None else now_s - st.hb_seen_s

    def rank_summary(self, rank: int, now_s: float) -> dict:
        """A rank's state beyond its position, as plain data: whether its exit is a
        failure, its span, its steps and where their time goes (the last 10), its
        lateness, its heartbeat's age, its completed ops per (group, group desc, op).
        What /metrics exports of a rank, and what a node's digest sends of it."""
        st = self.ranks[rank]
        steps = self.steptime.ranks.get(rank)
        score = self.straggler.score(rank)
        split = steps.recent() if steps is not None else None
        return {"failed": bool(st.exit is not None and st.exit.failed),
                "span": st.newest_span,
                "steps": steps.finished if steps is not None else 0,
                "split": None if split is None else {k: round(split[k], 3) for k in SPLIT},
                "late_ms": score["step_lateness_ms"] if score else None,
                "hb_age_s": self.heartbeat_age_s(rank, now_s),
                "progress": self.progress_summary(rank, now_s),
                "done": [[g, d, op, n, sec] for (g, d, op), (n, sec) in st.completed.items()]}

    def exited(self, rank: int, info: ExitInfo) -> None:
        st = self._rank(rank)
        if (info.how == "stopped" and st.exit is not None and not st.exit.failed
                and st.exit.how != "stopped"):
            return  # its log was closed on a normal exit: stopped while it tore down
        if st.exit is not None and st.exit.how in ("vanished", "unheard") and not info.failed:
            # "vanished" was a guess (pid gone, heartbeat stale); the launcher's word on the
            # exit (stopped by distdoctor, exit 0) replaces it, and its crash finding goes
            self.found.pop(("crash", rank), None)
        if (info.call is None and info.how == "exit" and st.exit is not None
                and st.exit.call is not None):  # the launcher's code, the log's line
            info = replace(info, call=st.exit.call)
        if info.how == "exit" and st.exit is not None and st.exit.how == "raised" \
                and info.failed:  # the launcher's code for the raise the rank's log saw
            info = replace(st.exit, code=info.code)
        st.exit = info

    def revive(self, rank: int) -> None:
        """A rank taken for dead was not: its exit and the crash finding go."""
        self._rank(rank).exit = None
        self.found.pop(("crash", rank), None)

    # --- analysis ----------------------------------------------------------------------
    def _now_ns(self, st: RankState, now_s: float | None) -> int | None:
        """The rank's clock now: its last heartbeat, moved on by the engine's time since."""
        base = max(st.hb_ns, st.max_t_ns)
        if not base:
            return None
        if now_s is not None and st.exit is None and st.rank in self.same_clock:
            return max(base, int(now_s * 1e9))  # exact: a heartbeat is up to 1 s old
        if now_s is not None and st.hb_seen_s is not None and st.exit is None:
            return max(base, st.hb_ns + int((now_s - st.hb_seen_s) * 1e9))
        return base

    def views(self, now_s: float | None) -> dict[int, RankView]:
        return {r: RankView(r, st.latest, st.last_done, self._now_ns(st, now_s),
                            st.exit.describe() if st.exit else None, st.issued,
                            st.exit is not None and st.exit.how == "stopped",
                            st.exit is not None and not st.exit.failed
                            and st.exit.how != "stopped",
                            st.exit.where() if st.exit is not None else None)
                for r, st in self.ranks.items()}

    def span_of(self, ev: Event) -> str | None:
        st = self.ranks.get(ev.rank)
        return st.spans.get(ev.span_index) if st and ev.span_index else None

    def tick(self, now_s: float | None, final: bool = False) -> list[Finding]:
        """New or changed findings. `now_s=None`: post-mortem (clocks stop at the last
        heartbeat); `final`: report disagreements without waiting for more ranks. Each
        detector runs behind the boundary (boundary.py): one that raises is said as an
        `internal` finding, and the others go on."""
        call = self.boundary.call
        for rv in list(self.open.values()):
            if rv.mismatch_since_s is not None and not rv.reported and (
                    final or not rv.missing or now_s is None
                    or now_s - rv.mismatch_since_s >= self.settle_s):
                call("mismatch", self._report_mismatch, rv, keep_on=True)
        views = self.views(now_s)
        failed = {r for r, st in self.ranks.items() if st.exit and st.exit.failed}
        call("threads", self._race_at_failure, failed)
        call("crash", self._judge_crashes, views, keep_on=True)
        self._now_s = now_s
        hangs = call("hang", self._judge_hangs, views, failed, default=[], keep_on=True)
        call("group order", self._judge_group_order, hangs)
        if final or now_s is None or not 0 <= now_s - self._scored_s < SCORE_EVERY_S:
            self._scored_s = now_s if now_s is not None else self._scored_s
            self._judge_stragglers(final)
        call("comm errors", self._put_error_findings, keep_on=True)
        for f in call("threads", self.thread_use.findings, default=[]):
            self._put(("threads", f.group), f)
        if self._held:
            self._release_held(None if final else now_s)
        return self.take_changed()

    def _judge_crashes(self, views: dict[int, RankView]) -> None:
        for f in crash_findings({r: st.exit for r, st in self.ranks.items() if st.exit},
                                views, self.open.values(),
                                # (a wrong-group mismatch is keyed by its ranks alone)
                                {(k[1], k[2]) for k in self.found
                                 if k[0] == "mismatch" and len(k) == 3},
                                self._rank_span, lambda r: self.ranks[r].recent):
            self._put(("crash", f.ranks[0]), f, quiet_update=True)

    def _report_mismatch(self, rv: Rendezvous) -> None:
        rv.reported = True
        earlier = [k for k in self.found if k[0] == "mismatch" and k[1] == rv.group]
        if earlier:
            # the first disagreement on a group is the cause; later ones follow from it
            self._mismatch_groups[rv.group] = self._mismatch_groups.get(rv.group, 0) + 1
            f = self.found[earlier[0]]
            f.details["later_mismatches_in_group"] = self._mismatch_groups[rv.group]
            return
        first = next(iter(rv.arrivals.values()))
        f = mismatch_finding(rv, self.span_of(first), self.habits.on(rv.group))
        if f is not None:  # the plain finding stands where its explanation fails
            self._put(("mismatch", rv.group, rv.seq), self.boundary.call(
                "parted", explain_mismatch, f, rv, self._histories(), self.span_of,
                default=f, keep_on=True))

    def _histories(self) -> dict:
        return {r: st.recent for r, st in self.ranks.items()}

    def _annotate_spans(self, f: Finding) -> None:
        """Which span (e.g. "step 12") each culprit's newest op was issued in."""
        spans = {str(r): name for r in f.ranks if (name := self._rank_span(r))}
        if spans:
            f.details["span_by_rank"] = spans

    def _rank_span(self, rank: int) -> str | None:
        """The span a rank is in now, by its newest op: in an op, the op's span; outside
        any, the span begun since its last op."""
        st = self.ranks.get(rank)
        if st is None or st.latest is None:
            return None
        if st.latest.t_end_ns is None:
            return self.span_of(st.latest)
        return st.newest_span or self.span_of(st.latest)
