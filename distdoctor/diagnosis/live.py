"""Live diagnosis of a running job: follow its run dir, feed the engine, keep
findings.json current, and hand each new finding to the front end (`distdoctor run`).

Each incarnation of the job (its ranks started again: runlog.incarnations) has an engine
of its own, so ranks of one launch are never compared with another's; an incarnation whose
ranks are all gone once a newer one runs gets a last pass and is then left as it is.

Runs in a background thread of the launcher, never inside a rank: the ranks only write
memory (DESIGN principle 1), all reading and analysis happens here.
"""

from __future__ import annotations

import gc
import os
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from distdoctor.diagnosis.budget import PassBudget
from distdoctor.diagnosis.crashes.crash import ExitInfo
from distdoctor.diagnosis.engine.core import Engine
from distdoctor.diagnosis.live_ranks import RankWatch
from distdoctor.diagnosis.optional import (
    gpu_findings_fn,
    log_scanner,
    progress_reader,
    sample_tail,
    start_sampler,
)
from distdoctor.diagnosis.report import SaidOnce
from distdoctor.findings import Finding, write_findings
from distdoctor.priority import lower_this_thread
from distdoctor.runlog.follow import RunFollower
from distdoctor.runlog.pace import SLOW_S
from distdoctor.runlog.reader import Event
from distdoctor.safetext import printable

# The follower's look at the logs, at most every POLL_S: the time-driven checks' own
# cadence (runlog.pace, SLOW_S), so that every pass may run them. A pass has a fixed cost
# (~0.7 ms at 2 ranks: the logs' headers and the ranks' samples, the detectors' clocks,
# liveness); at 2 ranks x 1,000 collectives/s a look every 0.25 s made `run` 0.94% of a
# core, every 0.5 s 0.75% (issue 49), for a finding up to a quarter second later
# (docs/benchmarks.md, detection latency).
POLL_S = SLOW_S
# The CPU budget of `run`'s process, its other threads included (budget.py): after a
# pass that took `c` seconds of CPU the next waits at least c / (CPU_SHARE - what the
# other threads use; at least a quarter of CPU_SHARE left), at most MAX_WAIT_S. Passes have a fixed cost (liveness checks,
# findings.json), and a pass's events cost less each in a larger batch (the engine's
# tables are read from memory once a pass, not once a poll), so a heavier job gets fewer,
# larger passes: the diagnosis may lag by a second or two, the job's cores stay the
# job's. 1% (issue 49's budget for `run`); a job that stops issuing ops (a hang, a
# mismatch) makes cheap passes, every POLL_S again.
CPU_SHARE = 0.01
MAX_WAIT_S = 2.0
# The follower and engine make an object per event (up to hundreds of thousands a second
# on a large job) and almost no cycles; at CPython's default (a collection every 700 new
# objects) the collector took a third of the live path's time (diagnosis_ingest.py).
# This process is distdoctor's own (the launcher), never a rank.
GC_THRESHOLDS = (100_000, 20, 100)
# The job's output awaiting the scanner, bounded in lines and in characters (the oldest
# go first). Bounded in lines only, 100 MB of 100,000-character lines took 372 MB here;
# and a pass scanned until nothing was pending, which a rank printing at full speed
# never let come (its hang never found). A pass takes what is pending when it begins.
MAX_PENDING_LINES = 10_000
MAX_PENDING_CHARS = 1 << 21  # 10,000 lines of 200: a verbose job's burst (NCCL INFO)
RECENT_OPS = 16  # per rank, kept by a viewer for its rank detail
# How long the owner's stop waits for a pass in progress. A pass never waits on the run
# dir (runlog.reader, runlog.follow: no FIFO is opened for good), so this only bounds the
# unforeseen: stopping the job, and `run`'s answer to SIGTERM, never hang on a pass.
LOCK_WAIT_S = 10.0


def label_incarnation(f: Finding, incarnation: int) -> Finding:
    """A finding of one incarnation of a job that has several, saying which."""
    if "incarnation" in f.details:
        return f
    return replace(f, summary=f"incarnation {incarnation}: {f.summary}",
                   details={**f.details, "incarnation": incarnation})


def relax_gc() -> None:
    gc.set_threshold(*GC_THRESHOLDS)


def failure_line(exc: BaseException) -> str:
    """An unforeseen failure in words for one line a person reads: its message (control
    characters stripped), then its type and where it was raised, never a repr."""
    from distdoctor.diagnosis.engine.boundary import MESSAGE_CHARS, where_raised

    site = where_raised(exc)
    where = f" at {os.path.basename(site)}" if site else ""
    message = printable(str(exc), MESSAGE_CHARS)
    return f"{message} ({type(exc).__name__}{where})" if message else (
        f"{type(exc).__name__}{where}")


@contextmanager
def _released(lock: threading.Lock):
    """Release `lock` (acquired already, with a timeout) at the end of the block."""
    try:
        yield
    finally:
        lock.release()


class LiveDiagnosis(RankWatch):
    def __init__(self, run_dir: str | Path, hang_timeout_s: float | None = None,
                 on_finding: Callable[[Finding], None] | None = None,
                 stacks: str = "culprits",
                 exits: Callable[[], dict[int, tuple[int, bool]]] | None = None,
                 owner: bool = True, backlog: int | None = None):
        """`owner`: this process runs the job (`distdoctor run`): it samples the node's
        probes, takes stacks and writes findings.json. A viewer (`distdoctor watch`)
        touches neither the ranks nor the run dir: it reads the owner's probe samples and
        starts `backlog` events back per rank."""
        self.run_dir = Path(run_dir)
        self.owner = owner
        if not owner:
            stacks = "none"  # py-spy attaching to the job is the owner's call, not a viewer's
        self.follower = RunFollower(run_dir, backlog)
        self.hang_timeout_s = hang_timeout_s
        self.engines: dict[int, Engine] = {}  # incarnation -> its engine
        self._done: set[int] = set()  # incarnations left as they are
        self._write_failed = False
        self.on_finding = on_finding
        self._said = SaidOnce()  # a rank's crash printed once, whichever source told it
        self.stacks_mode = stacks
        self.exits = exits  # rank -> (exit status, stopped by distdoctor), when known
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.host = socket.gethostname()
        self.error: str | None = None
        # the job's output lines, for the comm-error scanner (bounded: never hold the job)
        self._lines: deque[tuple[int | None, str]] = deque()
        self._pending_chars = 0
        self._lines_lock = threading.Lock()  # the relay's threads feed, a pass takes
        self._scanner = log_scanner()
        self.sampler = None
        self._progress = None  # the owner's reader of its local ranks' /proc (progress)
        self._stopped_by_us = False  # after `stopping`: the job's output is its reaction
        # a viewer's newest ops per rank (its rank detail); the owner keeps none
        self.recent: dict[int, dict[int, Event]] | None = None if owner else {}
        # a viewer's reader of the owner's probe files
        self._sample_tail = None if owner else sample_tail(self.run_dir)
        self._last_sample_t = None
        self._gpu_findings = gpu_findings_fn()
        # each pass's events of the newest incarnation, under the lock (a node's digest)
        self.on_batch: Callable[[list], None] | None = None

    @property
    def engine(self) -> Engine:
        """The newest incarnation's engine (the one a dashboard shows)."""
        return self._engine_of(self.follower.newest)

    def _engine_of(self, incarnation: int) -> Engine:
        engine = self.engines.get(incarnation)
        if engine is None:
            engine = self.engines[incarnation] = Engine(
                self.hang_timeout_s, stacks=lambda ranks: self._dump_stacks(incarnation, ranks))
            engine.gpu_findings = self._gpu_findings
        return engine

    def findings(self) -> list[Finding]:
        """Every incarnation's findings, each labelled when there are several."""
        return [self._label(i, f) for i in sorted(self.engines)
                for f in self.engines[i].findings()]

    def _label(self, incarnation: int, f: Finding) -> Finding:
        if self.follower.incarnations.count <= 1:
            return f
        return label_incarnation(f, incarnation)

    # --- lifecycle ---------------------------------------------------------------------
    def start(self) -> LiveDiagnosis:
        relax_gc()
        if self.owner:
            self.sampler = start_sampler(self.run_dir, self._local_pids)
            self._progress = progress_reader()
        self._thread = threading.Thread(target=self._loop, name="distdoctor-diagnosis",
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> list[Finding]:
        """Stop following, run a last pass with the final exits, and return all findings."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        if self.sampler is not None:
            try:
                self.sampler.stop()
            except Exception:
                pass
        if not self._lock.acquire(timeout=LOCK_WAIT_S):
            self._say_stuck("its last pass is skipped")
            return self.findings()
        with _released(self._lock):
            self._step(time.monotonic(), final=True)
            self.follower.close()
            return self.findings()

    def stopping(self) -> None:
        """The owner is about to stop the job: a rank still alive now is stopped, not
        crashed, whatever its launcher reports of it (a wrapped torchrun reports nothing
        per rank). Ranks already gone are found so first."""
        self._stopped_by_us = True
        if not self._lock.acquire(timeout=LOCK_WAIT_S):
            self._say_stuck("ranks alive now are not marked stopped")
            return
        with _released(self._lock):
            self._check_ranks(time.monotonic())
            for i, engine in self.engines.items():
                if i in self._done:
                    continue
                for rank, st in engine.ranks.items():
                    if st.exit is None:
                        engine.exited(rank, ExitInfo(None, "stopped"))

    def stopped_ranks(self) -> list[int]:
        """Ranks marked stopped by `stopping` (for exits.json)."""
        if not self._lock.acquire(timeout=LOCK_WAIT_S):
            return []
        with _released(self._lock):
            return sorted(r for r, st in self.engine.ranks.items()
                          if st.exit is not None and st.exit.how == "stopped"
                          and st.exit.code is None)

    def leave(self) -> None:
        """A viewer's stop: no last pass (it has no exits to add and writes nothing)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._lock.acquire(timeout=LOCK_WAIT_S):
            with _released(self._lock):
                self.follower.close()

    def _say_stuck(self, then: str) -> None:
        print(f"distdoctor: the live diagnosis is still in a pass after {LOCK_WAIT_S:.0f} s; "
              f"{then}", file=sys.stderr)

    def pass_once(self) -> None:
        """One pass without the background thread (a one-off view: `watch --once`)."""
        with self._lock:
            self._step(time.monotonic(), due=True)

    def close(self) -> None:
        self.follower.close()

    def _loop(self) -> None:
        lower_this_thread()
        budget, wait = PassBudget(CPU_SHARE, POLL_S, MAX_WAIT_S), POLL_S
        while not self._stop.wait(wait):
            budget.begin()
            try:
                with self._lock:
                    self._step(time.monotonic())
            except Exception as exc:  # never take the launcher (and the job) down
                self._pass_failed(exc)
            wait = budget.wait()

    def _pass_failed(self, exc: Exception) -> None:
        """A pass that raised outside the detectors' boundary (reading the run dir, the
        job's output): said once, as an internal finding, and the next pass goes on; the
        detectors, hang handling and `--on-hang kill` keep what they had."""
        first = self.error is None
        self.error = f"a pass of the live diagnosis failed: {failure_line(exc)}"
        if os.environ.get("DISTDOCTOR_DEBUG"):
            import traceback

            traceback.print_exc()
        with self._lock:
            engine = self.engine
            engine.boundary.failed("live pass", exc, keep_on=True)
            said = engine.take_changed()  # said here: a pass that fails each time says nothing
        if first and self.on_finding is not None:
            for f in said:
                self.on_finding(f)

    @property
    def scans_output(self) -> bool:
        return self._scanner is not None

    def feed_line(self, rank: int | None, text: str) -> None:
        """A line of the job's output (any thread); scanned on the next pass. Once
        distdoctor stops the job, what it prints is its reaction to that stop (a
        launcher's "received signal 15", a peer's "connection closed"): not scanned."""
        if self._scanner is None or self._stopped_by_us:
            return
        with self._lines_lock:
            self._lines.append((rank, text))
            self._pending_chars += len(text)
            while len(self._lines) > 1 and (self._pending_chars > MAX_PENDING_CHARS
                                            or len(self._lines) > MAX_PENDING_LINES):
                self._pending_chars -= len(self._lines.popleft()[1])

    def _take_lines(self) -> deque[tuple[int | None, str]]:
        with self._lines_lock:
            lines, self._lines, self._pending_chars = self._lines, deque(), 0
        return lines

    # --- one pass ----------------------------------------------------------------------
    def _step(self, now_s: float, final: bool = False, due: bool = False) -> None:
        batches = self.follower.poll_incarnations(final)
        for i in sorted(batches):
            self._engine_of(i).ingest(batches[i], now_s)
        for why in self.follower.said:  # names what ranks put in the run dir: text
            print(f"distdoctor: {printable(why)}", file=sys.stderr)
        self.follower.said.clear()
        engine = self.engine  # the newest incarnation's
        if self.on_batch is not None:
            self.on_batch(batches.get(self.follower.newest, ()))
        if self.recent is not None:
            self._remember(batches.get(self.follower.newest, ()))
        due = self.follower.plan(now_s, due or final, self.exits and self.exits(), self._lines)
        if due is None:  # nothing changed but samples, nothing is due: the job's pace
            return
        sample = self.sampler.latest() if self.sampler is not None else None
        if sample is not None and sample.t != self._last_sample_t:
            self._last_sample_t = sample.t
            engine.samples.append(sample)
        if self._sample_tail is not None:
            engine.samples.extend(self._sample_tail.read_new())
        if self._lines:
            # ranks that print nothing are still ranks: one that never reported a timeout
            # the others reported is the one that never arrived
            self._scanner.ranks_seen.update(self.follower.ranks_of(self.follower.newest))
        if self._scanner is not None:
            for rank, text in self._take_lines():
                self._scanner.feed(text, rank=rank)
            for f in self._scanner.changed():
                # an update goes where its first version went (the incarnation that printed
                # it), not to a newer incarnation started meanwhile
                held = next((e for e in self.engines.values() if e.says(f)), engine)
                held.add_finding(f)
        if due:  # and a new or closed log (a rank that shut down) is looked at at once
            self._check_ranks(now_s)
            self._read_progress(engine)
        if self.exits is not None:  # the launcher's ranks: each in its newest incarnation
            for rank, (code, stopped) in self.exits().items():
                newest = max((i for i, e in self.engines.items() if rank in e.ranks),
                             default=None)
                if newest is not None and newest not in self._done:
                    self.engines[newest].exited(
                        rank, ExitInfo(code, "stopped" if stopped else "exit"))
        changed = []
        for i, e in list(self.engines.items()):
            if i in self._done:
                continue
            changed += [self._label(i, f) for f in e.tick(now_s, final=final)]
            if i < self.follower.newest and e.ranks and not e.holding and all(
                    st.exit is not None for st in e.ranks.values()):
                self._done.add(i)  # its ranks are gone and a newer launch runs
        if self.owner and (changed or final):
            try:
                write_findings(self.run_dir, self.findings())
            except OSError as exc:  # a full disk: the findings are still printed
                if not self._write_failed:
                    self._write_failed = True
                    print(f"distdoctor: cannot write {self.run_dir}/findings.json "
                          f"({exc.strerror or exc}); findings are printed only",
                          file=sys.stderr)
        if self.on_finding is not None:
            for f in changed:
                if self._said.new(f):
                    self.on_finding(f)

    def _remember(self, events) -> None:
        """Each rank's newest ops by event number, for a viewer's rank detail; a
        completion replaces the in-flight record of the same op."""
        for ev in events:
            if ev.kind in ("span", "sample"):
                continue
            ops = self.recent.setdefault(ev.rank, {})
            ops[ev.index] = ev
            if len(ops) > 2 * RECENT_OPS:
                for index in sorted(ops)[:-RECENT_OPS]:
                    del ops[index]
