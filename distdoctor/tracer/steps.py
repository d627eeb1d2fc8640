"""Training steps and where a rank's time goes, with no change to the job's code.

A training loop marks its steps already: the optimizer steps once per step (torch's
global optimizer-step hooks see every optimizer), and a DataLoader hands out a batch per
step. Each becomes an implicit span in the rank's log (flagged FLAG_IMPLICIT):

- "step": from one optimizer step to the next. Its `seq` is the step's number as the
  user counts it: the optimizer steps taken (with several optimizers, a GAN's or Muon
  beside AdamW, the steps of the one that steps most: a step ends when an optimizer
  steps again), or the framework's own counter (HF
  Trainer's and Lightning's `global_step`, tracer/framework.py), and then its name says
  which ("global_step (Lightning)"). Before the first optimizer step (and in a loop
  with no optimizer), "batch": from one batch to the next, numbered by the batches
  handed out before it. The collectives issued inside carry it as their span, so the
  straggler detector sums lateness per real step.
- "data": each wait for the next batch (`DataLoader.__next__`).

The job's own spans win: once a boundary finds a span of the job's open, no implicit step
is opened again (the reference trainer's "step N" spans, `distdoctor.trace`).

A sampler thread looks at the main thread SAMPLE_HZ times a second and, when it is
outside a traced op, records its innermost user line (a "sample" event): where a slow
rank's extra time goes between collectives. One look is a `sys._current_frames()` and a
walk of the stack (~20 us with the GIL); DISTDOCTOR_SAMPLE_HZ=0 turns it off. A sample
also carries how long the main thread waited for a CPU since the previous one (its run
queue delay, /proc/self/task/TID/schedstat, read without the GIL in ~1 us): a rank that is
late because its node runs more threads than it has cores is told from one that works
more.

Everything here runs in the job's threads: it never raises, and costs a few dictionary
operations per step.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import weakref

from distdoctor.privatefiles import close_if_ours, identity_of
from distdoctor.runlog import format as F
from distdoctor.runlog.slots import native_module
from distdoctor.tracer import callsite, framework, state

SAMPLE_HZ = 50.0
_installed = False


class StepMarker:
    """Opens and closes the implicit "step" spans of one recorder. A step span's number
    is the steps taken before it: the framework's counter where one is found
    (tracer/framework.py), else the optimizer steps taken; before the first optimizer
    step, batches: the batches handed out before it ("batch N", not a step's number:
    a prefetched batch or a sanity check's would inflate it)."""

    def __init__(self, recorder):
        self.rec = recorder
        self.open = None  # the implicit step span's token
        self.step = 0  # optimizer steps taken
        self.stepped = weakref.WeakSet()  # the optimizers that stepped in this step
        self.batches = 0  # batches handed out before the first optimizer step
        self.by_optimizer = False  # an optimizer step was seen: batches no longer mark steps
        self.job_spans = False  # the job marks its own spans: nothing implicit any more
        self.counter = None  # the framework's counter, once found
        self._searches = 0

    def boundary(self, source: str, optimizer=None) -> None:
        rec = self.rec
        rec.exit_call = None  # a sys.exit before it was caught: the job went on (exits.py)
        if self.job_spans or (source == "data" and self.by_optimizer):
            return
        if source == "optimizer":
            self.by_optimizer = True
            if optimizer is not None and self.stepped and optimizer not in self.stepped:
                self.stepped.add(optimizer)  # another optimizer of the same step
                return
            self.stepped.clear()
            if optimizer is not None:
                self.stepped.add(optimizer)
            self.step += 1
        if any(token != self.open for token in rec._spans):
            self.job_spans = True  # a span of the job's own is open
            self._close()
            return
        self._close()
        name, number = self._number(source)
        self.open = rec.span_begin(name, seq=number, flags=F.FLAG_IMPLICIT)

    def _number(self, source: str) -> tuple[str, int]:
        counter = self.counter
        if counter is None and self._searches < framework.SEARCHES:
            self._searches += 1
            counter = self.counter = framework.find_counter(sys._getframe(2))
        value = counter.read() if counter is not None else None
        if value is not None:
            # the frameworks add one once optimizer.step() has returned, after this hook
            return counter.name, value + (source == "optimizer")
        self.counter = None  # none, or its trainer is gone (a new one may be found)
        if source == "optimizer":
            return "step", self.step
        self.batches += 1
        return "batch", self.batches - 1

    def _close(self) -> None:
        if self.open is not None:
            self.rec.span_end(self.open)
            self.open = None


def _marker():
    rec = state.recorder
    return None if rec is None else rec.steps


def _after_optimizer_step(optimizer, args, kwargs) -> None:
    try:
        marker = _marker()
        if marker is not None:
            marker.boundary("optimizer", optimizer)
    except Exception:
        pass


def _wrap_next(next_batch):
    def __next__(self):
        rec = state.recorder
        if rec is None:
            return next_batch(self)
        token = None
        try:
            rec.steps.boundary("data")
            token = rec.span_begin("data", flags=F.FLAG_IMPLICIT)
        except Exception:
            pass
        try:
            return next_batch(self)
        finally:
            if token is not None:
                rec.span_end(token)

    __next__.__wrapped__ = next_batch
    return __next__


def install_step_hooks() -> None:
    """Process-wide, once: they find the current recorder (state.recorder) at each call."""
    global _installed
    if _installed:
        return
    _installed = True
    try:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        register_optimizer_step_post_hook(_after_optimizer_step)
    except Exception:
        pass
    try:
        from torch.utils.data.dataloader import _BaseDataLoaderIter

        _BaseDataLoaderIter.__next__ = _wrap_next(_BaseDataLoaderIter.__next__)
    except Exception:
        pass


class Sampler:
    """Where the main thread is, SAMPLE_HZ times a second, while it is not inside a traced
    op (its wait is measured exactly by the op's own event)."""

    def __init__(self, recorder, hz: float):
        from distdoctor.tracer.ops import TRACED_OPS
        from distdoctor.tracer.process_group import TracingProcessGroup

        self.rec = recorder
        self.period = 1.0 / hz
        self._op_codes = {getattr(TracingProcessGroup, name).__code__
                          for name in TRACED_OPS.values()}
        # the C path of a traced method has no frame to find: it says so itself
        self._in_op = getattr(native_module(), "main_in_op", None) or (lambda: False)
        self._main = threading.main_thread().ident
        self._schedstat, *self._schedstat_fd = _open_schedstat(
            threading.main_thread().native_id)
        self._runq_ns = self._run_delay_ns()  # at the last sample recorded
        threading.Thread(target=self._loop, name="distdoctor-sampler", daemon=True).start()

    def _loop(self) -> None:
        stop = self.rec._stop
        try:
            while not stop.wait(self.period):
                if state.recorder is not self.rec:
                    continue  # switched off (benchmarks do): look at nothing
                if not self.rec.ring.intact():
                    return  # the job truncated or removed its log: write nothing more
                self.sample()
        except Exception:
            return
        finally:  # a rank that makes its group again starts a sampler each time
            self._schedstat = None
            close_if_ours(*self._schedstat_fd)

    def sample(self) -> None:
        if self._in_op():
            return  # inside a collective, in its C path
        frame = sys._current_frames().get(self._main)
        f = frame
        while f is not None:
            if f.f_code in self._op_codes:
                return  # inside a collective
            f = f.f_back
        user = callsite.user_frame(frame)
        if user is not None:
            # the wait since the last sample recorded: one inside a collective is passed
            # over, and its thread sleeps there (no CPU wanted, no run queue delay)
            now = self._run_delay_ns()
            runq_us = max(0, now - self._runq_ns) // 1000
            self._runq_ns = now
            self.rec.sample(user, time.monotonic_ns(), runq_us)

    def _run_delay_ns(self) -> int:
        reader = self._schedstat
        if reader is None:
            return 0
        try:
            return int(reader().split()[1])
        except (OSError, ValueError, IndexError):
            self._schedstat = None
            return 0


def _open_schedstat(tid: int | None) -> tuple:
    """(a reader, its descriptor, the file's identity) of the main thread's schedstat
    ("cpu ns, run queue ns, slices"), open for the sampler's life; (None, None, None)
    where there is none. It reads through libc with the GIL held (~1 us): os.pread would
    drop the GIL and queue behind the main thread for it again, a second hand-off each
    look."""
    try:
        fd = os.open(f"/proc/self/task/{tid}/schedstat", os.O_RDONLY | os.O_CLOEXEC)
        identity = identity_of(fd)
    except (OSError, TypeError):
        return None, None, None
    try:
        import ctypes

        pread = ctypes.PyDLL(None).pread
        pread.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_long)
        pread.restype = ctypes.c_ssize_t
        buf = ctypes.create_string_buffer(64)

        def read() -> bytes:
            n = pread(fd, buf, 64, 0)
            if n < 0:
                raise OSError("schedstat unreadable")
            return buf.raw[:n]

        read()
        return read, fd, identity
    except (OSError, AttributeError):
        return lambda: os.pread(fd, 64, 0), fd, identity


def sample_hz() -> float:
    try:
        return max(0.0, float(os.environ.get("DISTDOCTOR_SAMPLE_HZ", SAMPLE_HZ)))
    except ValueError:
        return SAMPLE_HZ
