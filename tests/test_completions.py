"""Completion of ops nobody waits on inside the traced call (completion.py): seen when the
next op enters or by a coarse sweeper, never by a callback on the backend's thread or a
tight poll."""

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


class _NoCallbacks(torch.futures.Future):
    """A future that fails the test if anyone hangs a callback on it."""

    def add_done_callback(self, fn):
        raise AssertionError("a done-callback was registered")

    def then(self, fn):
        raise AssertionError("a then-callback was registered")


class _AsyncCpuWork:
    """An async CPU op's work: its future completes later, on another thread."""

    def __init__(self):
        self.future = _NoCallbacks()

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
def test_async_cpu_op_is_seen_done_when_the_next_op_enters(recorder, monkeypatch):
    monkeypatch.setattr(completion, "SWEEP_S", 60.0)  # only the entry check can see it
    ring = recorder.ring
    e, work = _op(ring), _AsyncCpuWork()
    assert recorder.end((e, False, True), work) is work
    work.future.set_result([torch.ones(1)])
    assert _slot(ring, e)[1] == 0  # nobody looked yet
    before = time.monotonic_ns()
    recorder._pending.check()  # what `begin` does first
    status, end = _slot(ring, e)
    assert status == F.STATUS_OK and end >= before and len(recorder._pending) == 0


@pytest.mark.timeout(20)
def test_an_op_nothing_follows_is_seen_by_the_sweeper(recorder):
    ring = recorder.ring
    e, work = _op(ring), _StandInCudaWork()
    recorder.end((e, True, True), work)
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
    recorder.end((_op(recorder.ring), True, True), work)
    time.sleep(0.5)
    polls = work.polls
    # a 0.2 ms poll would have looked ~2,500 times; a 10 ms sweep looks ~50 times
    assert 5 <= polls <= 0.5 / completion.SWEEP_S * 1.5, polls


@pytest.mark.timeout(20)
def test_the_sweeper_sleeps_while_nothing_is_pending(recorder):
    work = _StandInCudaWork()
    recorder.end((_op(recorder.ring), True, True), work)
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
    recorder.end((cpu_e, False, True), cpu)
    recorder.end((cuda_e, True, True), cuda)
    cpu.future.set_exception(RuntimeError("[../gloo/transport/tcp/pair.cc:534] Read error"))
    cuda.error, cuda.finished = RuntimeError("Watchdog caught collective operation timeout"), True
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
    wrapped = recorder.end((e, False, True), JoinedWork([_WaitedPart(), _WaitedPart()]))
    recorder._pending.check(None)
    assert _slot(ring, e)[1] == 0 and len(recorder._pending) == 0  # nothing to look at
    wrapped.wait()
    assert _slot(ring, e)[0] == F.STATUS_OK and _slot(ring, e)[1] > 0


@pytest.mark.timeout(20)
def test_close_records_what_is_done_and_leaves_a_hung_op_in_flight(tmp_path):
    ring = RingWriter(str(tmp_path / "rank-0.ring"), 0, 1 << 16, 1 << 14)
    rec = Recorder(ring)
    done_e, done = _op(ring), _AsyncCpuWork()
    hung_e, hung = _op(ring), _AsyncCpuWork()
    rec.end((done_e, False, True), done)
    rec.end((hung_e, False, True), hung)
    threading.Timer(0.0, done.future.set_result, args=([],)).start()
    time.sleep(0.05)
    started = time.monotonic()
    rec.close()  # returns at once: nothing waits for the hung op
    assert time.monotonic() - started < 1.0
    assert _slot(ring, done_e)[1] > 0 and _slot(ring, hung_e)[1] == 0


@pytest.mark.timeout(20)
def test_an_idle_sweeper_parks_and_an_add_wakes_it(recorder, monkeypatch):
    monkeypatch.setattr(completion, "SWEEP_S", 0.01)
    monkeypatch.setattr(completion, "PARK_AFTER", 3)
    first = _StandInCudaWork()
    first.finished = True
    recorder.end((_op(recorder.ring), True, True), first)  # starts the sweeper
    deadline = time.monotonic() + 5
    while not recorder._pending._parked and time.monotonic() < deadline:
        time.sleep(0.01)
    assert recorder._pending._parked  # no op pending: it no longer wakes on its clock
    e, work = _op(recorder.ring), _StandInCudaWork()
    recorder.end((e, True, True), work)
    assert not recorder._pending._parked
    work.finished = True
    while _slot(recorder.ring, e)[1] == 0 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert _slot(recorder.ring, e)[0] == F.STATUS_OK
