"""The C hot path (runlog/_fast.c) records exactly what the Python path records.

The Python path is the reference and the fallback where no compiler was at hand at
install; DISTDOCTOR_PURE_PYTHON=1 selects it. Both are held to the same bytes (the slot
writer) and the same decoded events (real gloo jobs, every op family, DDP/FSDP2/DTensor/
pipelining from autograd's threads), and those jobs' logs read by the C and the Python
slot decoders (runlog/_decode.c) to the same events.
"""

from __future__ import annotations

import shutil
import struct
import sysconfig

import pytest
from conftest import run_job
from test_native_decode import read_both

from distdoctor.runlog import format as F
from distdoctor.runlog.run import read_run
from distdoctor.runlog.slots import PySlotWriter, native_module

pytestmark = pytest.mark.timeout(300)

native = native_module()
needs_native = pytest.mark.skipif(native is None, reason="the C hot path is not built")


def test_the_c_hot_path_is_built_where_a_compiler_is():
    if not (shutil.which(sysconfig.get_config_var("CC").split()[0] or "cc")
            or shutil.which("cc")):
        pytest.skip("no C compiler here: the Python path is the tracer")
    assert native is not None, "pip install should have built distdoctor.runlog._fast"


class _Owner:
    """What RingWriter does for its slot writer: the reserve's end, and a log of calls."""

    def __init__(self, make, capacity, ready):
        ring_offset = F.HEADER_SIZE
        self.buf = bytearray(ring_offset + capacity * F.SLOT_SIZE)
        self.calls = []
        self.writer = make(self.buf, ring_offset, capacity, 2 * F.SLOT_SIZE, self.near_end,
                           self.unrecorded)
        self.writer.ready = len(self.buf) if ready is None else ready

    def near_end(self, at):
        self.calls.append(("near_end", at))
        if at + F.SLOT_SIZE > self.writer.ready:
            self.writer.starved = True
            return False
        return True

    def unrecorded(self):
        self.calls.append(("unrecorded",))
        return -1


def _writers(capacity=8, ready=None):
    """A C and a Python slot writer over equal buffers."""
    return [_Owner(make, capacity, ready) for make in (native.SlotWriter, PySlotWriter)]


@needs_native
def test_slot_writers_write_the_same_bytes():
    owners = _writers()
    results = [[], []]
    for i, w in enumerate(o.writer for o in owners):
        for n in range(20):  # wraps the 8-slot ring twice
            e = w.append(F.KIND_COLLECTIVE, 3, 2, 5, 7, 11 + n, 1000 + n, -1 if n % 3 else 2,
                         13, 1 << 40, 17, 123456789 + n, n % 4, 0)
            results[i].append(e)
            if n % 2:
                w.complete(e, F.STATUS_OK, 2_000_000 + n)
            if n % 5 == 0:
                w.complete(e, F.STATUS_TIMEOUT, 3_000_000 + n, 99)
        w.complete(0, F.STATUS_OK, 5)  # slot reused since: ignored
        w.complete(-1, F.STATUS_OK, 5)  # an unrecorded event: ignored
    assert results[0] == results[1] == list(range(20))
    assert owners[0].buf == owners[1].buf
    head = struct.unpack_from("<Q", owners[0].buf, F.OFF_HEAD)[0]
    assert head == 20


@needs_native
def test_slot_writers_agree_when_the_disk_runs_out():
    """Past the reserved end a writer asks near_end; a refused slot is a hole, and every
    later append is unrecorded until the owner clears `starved`."""
    ring_offset = F.HEADER_SIZE
    owners = _writers(capacity=8, ready=ring_offset + 5 * F.SLOT_SIZE)
    for w in (o.writer for o in owners):
        got = [w.append(1, 1, 255, 0, 1, 1, n, -1, 0, 1, 1, n, 0, 0) for n in range(7)]
        assert got == [0, 1, 2, 3, 4, -1, -1]
        assert w.starved is True
        w.starved, w.ready = False, ring_offset + 8 * F.SLOT_SIZE
        assert w.append(1, 1, 255, 0, 1, 1, 9, -1, 0, 1, 1, 9, 0, 0) == 6
    c, py = owners
    assert c.buf == py.buf
    assert c.calls == py.calls
    assert ("unrecorded",) in c.calls


@needs_native
def test_a_released_c_writer_refuses_politely():
    w = _writers()[0].writer
    w.release()
    with pytest.raises(ValueError):
        w.append(1, 1, 255, 0, 1, 1, 0, -1, 0, 1, 1, 0, 0, 0)
    with pytest.raises(ValueError):
        w.complete(0, F.STATUS_OK, 1)
    w.release()  # twice is fine


def _decoded(run_dir):
    """Each rank's events with everything but the clock."""
    run = read_run(run_dir)
    out = {}
    for rank, events in run.events.items():
        out[rank] = [(ev.kind, ev.op, ev.status, ev.group, ev.group_ranks, ev.seq, ev.peer,
                      ev.shapes, ev.dtypes, ev.device, ev.numel_in, ev.numel_out,
                      ev.reduce_op, ev.callsite, ev.span_index, ev.name, ev.error,
                      ev.is_async, ev.other_thread) for ev in events
                     if ev.kind != "sample"]  # where the sampler happened to look
    return out


@needs_native
@pytest.mark.parametrize("job,nproc", [("all_ops.py", 4), ("parallel_stack.py", 2)])
def test_c_and_python_paths_record_the_same_events(tmp_path, job, nproc):
    runs = {}
    for name, pure in (("c", "0"), ("python", "1")):
        run_dir = tmp_path / name
        res = run_job(job, nproc, run_dir, timeout=180, env={"DISTDOCTOR_PURE_PYTHON": pure})
        assert res.returncode == 0, res.stderr
        assert "tracing continues without it" not in res.stderr, res.stderr
        runs[name] = _decoded(run_dir)
        for log in sorted((run_dir / "ranks").glob("*.ring")):  # and read both ways
            by_c, by_python = read_both(log)
            assert by_c == by_python and len(by_c) > 10, log.name
    assert runs["c"].keys() == runs["python"].keys()
    for rank in runs["c"]:
        c, py = runs["c"][rank], runs["python"][rank]
        assert len(c) == len(py) > 10
        for a, b in zip(c, py, strict=True):
            assert a == b, f"rank {rank}:\n  C      {a}\n  Python {b}"
