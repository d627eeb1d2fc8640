"""At exit the recorder lets completion callbacks still queued on the backend's threads run
first: one run (or freed) there once the interpreter is finalizing cannot take the GIL and
aborts the process (std::terminate, SIGABRT)."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from distdoctor.runlog import format as F
from distdoctor.runlog.ring import RingWriter
from distdoctor.tracer.recorder import Recorder


class _AsyncWork:
    """An async CPU op's work: its future completes later, on another thread."""

    def __init__(self):
        self.future = torch.futures.Future()

    def get_future(self):
        return self.future


def _end_ns(ring: RingWriter, e: int) -> int:
    at = ring.ring_offset + (e % ring.capacity) * F.SLOT_SIZE
    return F.I64.unpack_from(ring._mm, at + F.OFF_SLOT_END)[0]


@pytest.mark.timeout(20)
def test_close_waits_for_pending_completion_callbacks(tmp_path):
    ring = RingWriter(str(tmp_path / "rank-0.ring"), 0, 1 << 16, 1 << 14)
    rec = Recorder(ring)
    e = ring.append(F.KIND_COLLECTIVE, F.OP_CODE["all_reduce"], 0, F.FLAG_ASYNC, 0, 0, 0,
                    -1, 0, 1, 1, time.monotonic_ns(), 0, 0)
    work = _AsyncWork()
    assert rec.end((e, False, True), work) is work
    assert rec._callbacks_pending == 1 and _end_ns(ring, e) == 0
    threading.Timer(0.2, work.future.set_result, args=(None,)).start()
    rec.close()
    assert _end_ns(ring, e) > 0 and rec._callbacks_pending == 0  # it ran before close ended


@pytest.mark.timeout(20)
def test_close_gives_up_on_a_callback_that_never_comes(tmp_path, monkeypatch):
    monkeypatch.setattr("distdoctor.tracer.recorder.EXIT_CALLBACK_WAIT_S", 0.1)
    ring = RingWriter(str(tmp_path / "rank-0.ring"), 0, 1 << 16, 1 << 14)
    rec = Recorder(ring)
    e = ring.append(F.KIND_COLLECTIVE, F.OP_CODE["all_reduce"], 0, F.FLAG_ASYNC, 0, 0, 0,
                    -1, 0, 1, 1, time.monotonic_ns(), 0, 0)
    rec.end((e, False, True), _AsyncWork())  # a hung op: never completes
    rec.close()  # returns (the test's timeout would catch a close that waits forever)
    assert _end_ns(ring, e) == 0 and rec._callbacks_pending == 1
