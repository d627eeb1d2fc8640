"""When a CUDA op finishes: seen by looking, never in a tight poll.

A CUDA op's future completes when the op is *enqueued*; its end is its CUDA end event,
which `Work.is_completed()` queries. Polling that every fraction of a millisecond from a
thread (as the tracer once did) takes the GIL thousands of times a second, because on a
GPU job some op is nearly always in flight: the Python thread that feeds the GPU then
fights the tracer for the GIL.

Here a pending op is looked at instead:
- when the next op enters, on the thread that issues it, which holds the GIL anyway (the
  oldest ENTRY_CHECKS pending ops: a pybind call of ~0.2 us each, no lock);
- by one sweeper thread every SWEEP_S, for ops that nothing follows soon (the last op
  before the step's host sync, a hang). Every wake of a Python thread takes the GIL,
  and on a machine whose cores the ranks fill, each such hand-off can cost the training
  thread a scheduling delay of its own; so the sweeper wakes on a fixed clock (at most
  1/SWEEP_S times a second, never per op), and sleeps until the next add once it has
  found nothing pending for PARK_AFTER sweeps.

An op's completion time is when it was seen done: late by at most the gap to the next op
issued, or SWEEP_S. (CPU work completes exactly, in the caller's wait or its future's
callback: recorder.py.) A hang (seconds) and an op's place in the order are unaffected.
"""

from __future__ import annotations

import os
import threading
import time
import weakref

from distdoctor.runlog import format as F

SWEEP_S = 0.05
PARK_AFTER = 20  # sweeps that found nothing pending before the sweeper sleeps until an add
ENTRY_CHECKS = 2


def _done_work(work) -> BaseException | None | bool:
    """False while the op is in flight; then None (done) or its error. Never
    `work.wait()`: it would make this thread's stream wait. Nor `work.exception()` or
    `is_success()`: torch prints a deprecation warning into the job's stderr on the first
    call. An error that `is_completed()` raises is the op's; a failed NCCL op that it
    reports as completed is recorded as done, and its error reaches the findings from
    the watchdog's own report (the job's output, the Flight Recorder)."""
    try:
        return False if not work.is_completed() else None
    except Exception as err:
        return err


class StreamEnd:
    """The end of a CUDA op that returned no work: a synchronous NCCL collective on torch
    2.8 and later is queued on the current stream and the call returns None, not done.
    A CUDA event recorded on that stream right after the call stands for the op's end;
    `is_completed()` answers as a Work's does."""

    __slots__ = ("_event",)

    def __init__(self, event):
        self._event = event

    def is_completed(self) -> bool:
        return self._event.query()

    @classmethod
    def now(cls):
        """A StreamEnd for what the current CUDA stream holds now, or None where there is
        no such stream to look at (a graph being captured: no event may be queried then)."""
        try:
            import torch

            if torch.cuda.is_current_stream_capturing():
                return None
            event = torch.cuda.Event()
            event.record()
            return cls(event)
        except Exception:
            return None


class PendingCompletions:
    """CUDA ops in flight, whose completion is found by looking (see the module docstring)."""

    def __init__(self, ring, fail):
        self._ring = ring
        self._fail = fail  # (event, exception): records a failed op
        self._pending: list = []  # (event, work), oldest first
        self._cv = threading.Condition()
        self._stop = False
        self._parked = False  # the sweeper waits for an add
        self._thread: threading.Thread | None = None
        # a forked child (a data-loader worker) has no sweeper, and the lock may have been
        # held by it at the fork: the child starts empty. Through a weak reference: a
        # hook is never unregistered, and it must not keep an old incarnation's recorder
        # (its log, its sites) alive for the process's life.
        me = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: (p := me()) is not None and p._forget())

    def _forget(self) -> None:
        self._pending, self._cv, self._thread = [], threading.Condition(), None

    def __len__(self) -> int:
        return len(self._pending)

    def add_work(self, e: int, work) -> None:
        with self._cv:
            self._pending.append((e, work))
            if self._thread is None:
                self._thread = threading.Thread(target=self._sweep_loop,
                                                 name="distdoctor-completions", daemon=True)
                self._thread.start()
            elif self._parked:
                self._parked = False
                self._cv.notify()

    def check(self, limit: int | None = ENTRY_CHECKS) -> None:
        """Record the ops among the oldest `limit` pending ones (all: None) that are done.
        Looking takes no lock; only taking done ops off the list does."""
        pending = self._pending
        if not pending:
            return
        head = pending[:limit] if limit is not None else list(pending)
        finished = []
        for item in head:
            outcome = _done_work(item[1])
            if outcome is not False:
                finished.append((item, outcome))
        if not finished:
            return
        now = time.monotonic_ns()
        with self._cv:  # the sweeper and the next op may both have seen it: one records it
            present = {id(item) for item in self._pending}
            finished = [(item, outcome) for item, outcome in finished if id(item) in present]
            gone = {id(item) for item, _ in finished}
            self._pending = [item for item in self._pending if id(item) not in gone]
        for (e, _), outcome in finished:
            if outcome is None:
                self._ring.complete(e, F.STATUS_OK, now)
            else:
                self._fail(e, outcome)

    def _sweep_loop(self) -> None:
        idle = 0
        while True:
            with self._cv:
                idle = 0 if self._pending else idle + 1
                if idle >= PARK_AFTER:
                    self._parked, idle = True, 0
                    while self._parked and not self._stop:
                        self._cv.wait()
                if self._stop:
                    return
            time.sleep(SWEEP_S)
            try:
                self.check(None)
            except Exception:
                pass

    def close(self) -> None:
        """Record what is done by now, and let the sweeper go."""
        try:
            self.check(None)
        except Exception:
            pass
        with self._cv:
            self._stop, self._parked = True, False
            self._cv.notify()
