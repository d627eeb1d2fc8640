"""Completion of ops nobody waits on inside the traced call. CUDA ops (completion.py): seen
when the next op enters or by a coarse sweeper, never in a tight poll. Async CPU ops: their
future's callback, exactly; at exit the recorder lets callbacks still queued run first
(one run or freed on gloo's thread once the interpreter is finalizing aborts the process)."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from distdoctor.runlog import format as F
from distdoctor.runlog.ring import RingWriter
from distdoctor.tracer import completion
from distdoctor.tracer.recorder import Recorder
from distdoctor.tracer.work import JoinedWork


class _AsyncCpuWork:
    """An async CPU op's work: its future completes later, on another thread."""

    def __init__(self):
        self.future = torch.futures.Future()

    def get_future(self):
        return self.future


class _StandInCudaWork:
    """A CUDA op's work as the recorder sees it: done when `is_completed()` says so (its
    future would complete at enqueue); an error there is raised from `is_completed()`.
    `exception()` and `is_success()` fail the test: torch prints a deprecation warning
    into the job's stderr when they are called."""

    def __init__(self):
        self.finished = False
        self.error = None
        self.polls = 0

    def is_completed(self):
        self.polls += 1
        if self.error is not None:
            raise self.error
        return self.finished

    def exception(self):
        raise AssertionError("Work.exception() prints a deprecation warning")

    def is_success(self):
        raise AssertionError("Work.is_success() prints a deprecation warning")

    def get_future(self):
        raise AssertionError("a CUDA work's future says nothing about its end")


def _slot(ring: RingWriter, e: int) -> tuple[int, int]:
    """(status, end ns) of event e."""
    at = ring.ring_offset + (e % ring.capacity) * F.SLOT_SIZE
    return ring._mm[at + F.OFF_SLOT_STATUS], F.I64.unpack_from(ring._mm, at + F.OFF_SLOT_END)[0]


def _op(ring: RingWriter) -> int:
    return ring.append(F.KIND_COLLECTIVE, F.OP_CODE["all_reduce"], 0, F.FLAG_ASYNC, 0, 0, 0,
                       -1, 0, 1, 1, time.monotonic_ns(), 0, 0)


@pytest.fixture
def recorder(tmp_path):
    ring = RingWriter(str(tmp_path / "rank-0.ring"), 0, 1 << 16, 1 << 14)
    rec = Recorder(ring)
    yield rec
    rec.close()


@pytest.mark.timeout(20)
def test_cuda_op_is_seen_done_when_the_next_op_enters(recorder, monkeypatch):
    monkeypatch.setattr(completion, "SWEEP_S", 60.0)  # only the entry check can see it
    ring = recorder.ring
    e, work = _op(ring), _StandInCudaWork()
    assert recorder.end((e, True, True, "allreduce"), work) is work
    work.finished = True
    assert _slot(ring, e)[1] == 0  # nobody looked yet
    before = time.monotonic_ns()
    recorder._pending.check()  # what `begin` does first
    status, end = _slot(ring, e)
    assert status == F.STATUS_OK and end >= before and len(recorder._pending) == 0


@pytest.mark.timeout(20)
def test_async_cpu_op_completes_when_its_future_does(recorder):
    ring = recorder.ring
    e, work = _op(ring), _AsyncCpuWork()
    assert recorder.end((e, False, True, "allreduce"), work) is work
    assert _slot(ring, e)[1] == 0
    done = time.monotonic_ns()
    work.future.set_result([torch.ones(1)])
    assert _slot(ring, e)[0] == F.STATUS_OK and _slot(ring, e)[1] >= done


@pytest.mark.timeout(20)
def test_an_op_nothing_follows_is_seen_by_the_sweeper(recorder):
    ring = recorder.ring
    e, work = _op(ring), _StandInCudaWork()
    recorder.end((e, True, True, "allreduce"), work)
    time.sleep(0.05)
    assert _slot(ring, e)[1] == 0
    finished = time.monotonic_ns()
    work.finished = True
    deadline = time.monotonic() + 5
    while _slot(ring, e)[1] == 0 and time.monotonic() < deadline:
        time.sleep(0.005)
    status, end = _slot(ring, e)
    assert status == F.STATUS_OK and finished <= end
    assert (end - finished) / 1e9 < 1.0  # seen within a sweep or so (generous: shared CI)


@pytest.mark.timeout(20)
def test_the_sweeper_looks_every_sweep_interval_not_in_a_tight_poll(recorder):
    work = _StandInCudaWork()  # in flight for the whole test
    recorder.end((_op(recorder.ring), True, True, "allreduce"), work)
    time.sleep(0.5)
    polls = work.polls
    # a 0.2 ms poll would have looked ~2,500 times; a 10 ms sweep looks ~50 times
    assert 5 <= polls <= 0.5 / completion.SWEEP_S * 1.5, polls


@pytest.mark.timeout(20)
def test_the_sweeper_sleeps_while_nothing_is_pending(recorder):
    work = _StandInCudaWork()
    recorder.end((_op(recorder.ring), True, True, "allreduce"), work)
    work.finished = True
    time.sleep(0.1)
    assert len(recorder._pending) == 0
    polls = work.polls
    time.sleep(0.3)
    assert work.polls == polls


@pytest.mark.timeout(20)
def test_failures_are_recorded_with_their_error(recorder):
    ring = recorder.ring
    cpu_e, cpu = _op(ring), _AsyncCpuWork()
    cuda_e, cuda = _op(ring), _StandInCudaWork()
    recorder.end((cpu_e, False, True, "allreduce"), cpu)
    recorder.end((cuda_e, True, True, "allreduce"), cuda)
    cpu.future.set_exception(RuntimeError("[../gloo/transport/tcp/pair.cc:534] Read error"))
    cuda.error = RuntimeError("Watchdog caught collective operation timeout")
    recorder._pending.check(None)
    assert _slot(ring, cpu_e)[0] == F.STATUS_ERROR
    assert _slot(ring, cuda_e)[0] == F.STATUS_TIMEOUT


class _WaitedPart(_StandInCudaWork):
    """gloo's _reduce_scatter_base work: no future, and is_completed() stays False."""

    def wait(self, timeout=None):
        return True


@pytest.mark.timeout(20)
def test_work_without_a_future_completes_when_the_caller_waits(recorder):
    ring = recorder.ring
    e = _op(ring)
    wrapped = recorder.end((e, False, True, "reduce_scatter_single"),
                           JoinedWork([_WaitedPart(), _WaitedPart()]))
    recorder._pending.check(None)
    assert _slot(ring, e)[1] == 0 and len(recorder._pending) == 0  # nothing to look at
    wrapped.wait()
    assert _slot(ring, e)[0] == F.STATUS_OK and _slot(ring, e)[1] > 0


class _Futureless(_WaitedPart):
    asked = 0

    def get_future(self):
        _Futureless.asked += 1
        raise RuntimeError("Work::getFuture not implemented.")


@pytest.mark.timeout(20)
def test_a_method_whose_works_have_no_future_is_asked_once(recorder):
    ring = recorder.ring
    events = [_op(ring) for _ in range(3)]
    for e in events:  # the C++ exception of get_future() costs ~8 us: not per op
        recorder.end((e, False, True, "send"), _Futureless()).wait()
    assert _Futureless.asked == 1
    assert all(_slot(ring, e)[1] > 0 for e in events)


@pytest.mark.timeout(20)
def test_close_records_cuda_ops_done_and_leaves_a_hung_one_in_flight(tmp_path):
    ring = RingWriter(str(tmp_path / "rank-0.ring"), 0, 1 << 16, 1 << 14)
    rec = Recorder(ring)
    done_e, done = _op(ring), _StandInCudaWork()
    hung_e, hung = _op(ring), _StandInCudaWork()
    rec.end((done_e, True, True, "allreduce"), done)
    rec.end((hung_e, True, True, "allreduce"), hung)
    done.finished = True
    started = time.monotonic()
    rec.close()  # returns at once: nothing waits for the hung op
    assert time.monotonic() - started < 1.0
    assert _slot(ring, done_e)[1] > 0 and _slot(ring, hung_e)[1] == 0


@pytest.mark.timeout(20)
def test_close_waits_for_pending_completion_callbacks(tmp_path):
    ring = RingWriter(str(tmp_path / "rank-0.ring"), 0, 1 << 16, 1 << 14)
    rec = Recorder(ring)
    e, work = _op(ring), _AsyncCpuWork()
    assert rec.end((e, False, True, "allreduce"), work) is work
    assert len(rec._callbacks_alive) == 1 and _slot(ring, e)[1] == 0
    threading.Timer(0.2, work.future.set_result, args=(None,)).start()
    rec.close()
    assert _slot(ring, e)[1] > 0 and not rec._callbacks_alive  # it ran before close ended


class _FutureFreeingLate:
    """A future as torch's is, seen from the caller: it calls its done-callback on its
    own thread, then frees it some time later (torch frees the callable's guard after
    the call returns, on gloo's thread, and must take the GIL again to do so)."""

    def __init__(self, hold_s: float):
        self.hold_s = hold_s
        self.freed_at = None

    def add_done_callback(self, callback):
        def complete():
            nonlocal callback
            callback(self)
            time.sleep(self.hold_s)
            callback = None  # the last reference: freed here, on this thread
            self.freed_at = time.monotonic()

        threading.Thread(target=complete, daemon=True).start()

    def value(self):
        return None


@pytest.mark.timeout(20)
def test_close_waits_until_a_callback_that_ran_is_freed(tmp_path):
    """A traced DDP job died of SIGABRT at exit about 1 run in 100 to 150: the callback had run, so
    close() returned, and gloo's thread then asked for the GIL of a finalizing
    interpreter to free it. Called is not enough: close() waits for the free."""
    ring = RingWriter(str(tmp_path / "rank-0.ring"), 0, 1 << 16, 1 << 14)
    rec = Recorder(ring)
    e, work = _op(ring), _AsyncCpuWork()
    work.future = _FutureFreeingLate(hold_s=0.2)
    rec.end((e, False, True, "allreduce"), work)
    rec.close()
    closed_at = time.monotonic()
    assert _slot(ring, e)[1] > 0  # it ran
    assert work.future.freed_at is not None and work.future.freed_at <= closed_at
    assert not rec._callbacks_alive


@pytest.mark.timeout(20)
def test_close_gives_up_on_a_callback_that_never_comes(tmp_path, monkeypatch):
    monkeypatch.setattr("distdoctor.tracer.recorder.EXIT_CALLBACK_WAIT_S", 0.1)
    ring = RingWriter(str(tmp_path / "rank-0.ring"), 0, 1 << 16, 1 << 14)
    rec = Recorder(ring)
    e = _op(ring)
    rec.end((e, False, True, "allreduce"), _AsyncCpuWork())  # a hung op: never completes
    rec.close()  # returns (the test's timeout would catch a close that waits forever)
    assert _slot(ring, e)[1] == 0 and len(rec._callbacks_alive) == 1


@pytest.mark.timeout(20)
def test_an_idle_sweeper_parks_and_an_add_wakes_it(recorder, monkeypatch):
    monkeypatch.setattr(completion, "SWEEP_S", 0.01)
    monkeypatch.setattr(completion, "PARK_AFTER", 3)
    first = _StandInCudaWork()
    first.finished = True
    recorder.end((_op(recorder.ring), True, True, "allreduce"), first)  # starts the sweeper
    deadline = time.monotonic() + 5
    while not recorder._pending._parked and time.monotonic() < deadline:
        time.sleep(0.01)
    assert recorder._pending._parked  # no op pending: it no longer wakes on its clock
    e, work = _op(recorder.ring), _StandInCudaWork()
    recorder.end((e, True, True, "allreduce"), work)
    assert not recorder._pending._parked
    work.finished = True
    while _slot(recorder.ring, e)[1] == 0 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert _slot(recorder.ring, e)[0] == F.STATUS_OK
