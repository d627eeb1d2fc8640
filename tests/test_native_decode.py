"""The readers' C slot decoder (runlog/_decode.c) gives the events the Python decoder gives.

The Python decoder (runlog/reader.py, RankLog._decode) is the reference and the fallback;
the C one runs for every event a reader takes. Held to the same events on what a log can
hold: a real job's (test_native.py reads its jobs' logs both ways) and a crafted one here,
whose slots carry random codes, ids past the string table, ids naming strings of another
kind, in-flight slots with an end time, and slots not holding their event.
"""

from __future__ import annotations

import random
import shutil
import sysconfig

import pytest

from distdoctor.runlog import format as F
from distdoctor.runlog import reader
from distdoctor.runlog.reader import Event, RankLog
from distdoctor.runlog.ring import RingWriter
from distdoctor.runlog.slots import native_decoder

native = native_decoder()
needs_native = pytest.mark.skipif(native is None, reason="the C decoder is not built")

STRINGS = [
    {"name": "0", "desc": "default_pg", "ranks": [0, 1, 2, 3]},
    {"name": "7", "desc": "tp", "ranks": [0, 1]},
    {"name": "8", "ranks": [0, "one"]},  # ranks that are no ranks: an unknown group
    {"shapes": [[1024], [2, "s0"]], "dtypes": ["float32", "bfloat16"], "device": "cpu"},
    {"shapes": [[-1]], "dtypes": ["float32"], "device": "cuda:0"},  # a dim out of range
    {"file": "/job/train.py", "line": 88, "function": "step"},
    "step",  # a span name
    "Connection closed by peer [127.0.0.1]:29500",
    12345,  # a name or call site that is a number: str() / unknown
    [1, 2, 3],
]


def test_the_c_decoder_is_built_where_a_compiler_is():
    if not (shutil.which(sysconfig.get_config_var("CC").split()[0] or "cc")
            or shutil.which("cc")):
        pytest.skip("no C compiler here: the Python decoder reads the logs")
    assert native is not None, "pip install should have built distdoctor.runlog._decode"


def read_both(path, pieces: int | None = None) -> tuple[list, list]:
    """The log's events through the C decoder and through the Python one, each from a
    reader of its own (their caches fill as they read); `pieces`: read that many slots
    a time, so a piece meets strings its reader has not cached yet."""
    out = []
    saved = reader._native
    try:
        for decoder in (native, None):
            reader._native = decoder
            log = RankLog(path)
            head = log.header().head
            step = pieces or head
            events = []
            for at in range(0, head, step):
                events += log.read_range(at, min(head, at + step))
            events += [log.read_one(e) for e in range(0, head, 97)]
            log.close()
            out.append(events)
    finally:
        reader._native = saved
    return out[0], out[1]


def crafted_log(path, slots: int = 3000, seed: int = 7) -> None:
    rng = random.Random(seed)
    w = RingWriter(str(path), rank=3, ring_bytes=(slots + 64) * F.SLOT_SIZE,
                   strings_bytes=1 << 16)
    ids = [w.add_string(s) for s in STRINGS]
    top = max(ids) + 4  # a few ids past the table
    for e in range(slots):
        body = bytearray(rng.randbytes(F.SLOT_SIZE))
        index = e + 1 if rng.random() > 0.05 else rng.choice((0, e, e + 2))
        F.U64.pack_into(body, 0, index)
        body[8] = rng.randrange(0, 6)  # kind (0, 5: unknown)
        body[9] = rng.randrange(0, 5)  # status (0: in flight, its end time set anyway)
        body[10] = rng.randrange(0, len(F.OPS) + 3)
        body[11] = rng.randrange(0, len(F.REDUCE_OPS) + 3)
        body[12] = rng.randrange(0, 16)  # flags
        for off in (16, 20, 36, 80, 84):  # group, call site, tensors, name, error ids
            F.U32.pack_into(body, off, rng.choice((0, rng.randrange(0, top))))
        w.put_slot(e, bytes(body))
    F.U64.pack_into(w._mm, F.OFF_HEAD, slots)
    w.close()


@needs_native
@pytest.mark.parametrize("pieces", [None, 7])
def test_c_and_python_decoders_agree_on_a_crafted_log(tmp_path, pieces):
    path = tmp_path / "rank-00003.ring"
    crafted_log(path)
    c, py = read_both(path, pieces)
    assert len(c) == len(py) > 3000
    assert all(ev is None or isinstance(ev, Event) for ev in c)
    for a, b in zip(c, py, strict=True):
        assert a == b, f"C      {a}\nPython {b}"
    decoded = [ev for ev in c if ev is not None]
    # the crafted log covers what the decoder must tell apart
    assert any(ev.status == "in_flight" and ev.t_end_ns is None for ev in decoded)
    assert any(ev.callsite is None for ev in decoded) and any(ev.callsite for ev in decoded)
    assert any(ev.name == "12345" for ev in decoded)
    assert any(ev.group_ranks == () and ev.group == "8" for ev in decoded)
    assert 0 < sum(ev is None for ev in c) < len(c) // 10


@needs_native
def test_the_c_decoder_falls_back_to_calling_a_class_that_is_not_a_plain_slots_one():
    """An event class with fields of its own making is called, never filled in place."""
    data = bytearray(F.SLOT_SIZE * 2)
    F.U64.pack_into(data, 0, 11)  # event 10
    data[8], data[9], data[10] = F.KIND_COLLECTIVE, F.STATUS_OK, 1
    F.U64.pack_into(data, F.SLOT_SIZE, 5)  # not event 11: None

    class Counted:
        made = 0

        def __init__(self, *fields):
            Counted.made += 1
            self.fields = fields

    codes = {F.KIND_COLLECTIVE | 1 << 8 | F.STATUS_OK << 16: ("collective", "all_reduce", "ok",
                                                             "sum", False, False, False)}
    groups, tensors = {0: ("?", "", ())}, {0: ((), (), "")}
    events, misses = native.decode(bytes(data), 10, 0, groups, tensors, codes, [None], {},
                                   Counted)
    assert misses == 0 and Counted.made == 1 and events[1] is None
    assert events[0].fields[:5] == (0, 10, "collective", "all_reduce", "ok")
    # an unknown code combination is left to the Python decoder: the event's number
    events, misses = native.decode(bytes(data), 10, 0, groups, tensors, {}, [None], {}, Event)
    assert misses == 1 and events == [10, None]
