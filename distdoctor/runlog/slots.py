"""The event log's slot writer: appends records and marks them complete.

Two implementations with one interface: `distdoctor.runlog._fast.SlotWriter` (C, built at
install when a compiler is there) and `PySlotWriter` below, the reference and the
fallback. `make_slot_writer` picks one; DISTDOCTOR_PURE_PYTHON=1 forces Python.

Store order, which readers rely on: a slot's number word is cleared, the body written,
then the number, then the header's head; a completion writes the end time last.
"""

from __future__ import annotations

import itertools
import os

from distdoctor.runlog import format as F


def pure_python() -> bool:
    """DISTDOCTOR_PURE_PYTHON set: the C paths are not used."""
    return os.environ.get("DISTDOCTOR_PURE_PYTHON", "") not in ("", "0")


def native_module():
    """distdoctor.runlog._fast, or None (not built, or DISTDOCTOR_PURE_PYTHON set)."""
    if pure_python():
        return None
    try:
        from distdoctor.runlog import _fast
    except ImportError:
        return None
    return _fast


def native_decoder():
    """distdoctor.runlog._decode, the readers' slot decoder, or None (as native_module)."""
    if pure_python():
        return None
    try:
        from distdoctor.runlog import _decode
    except ImportError:
        return None
    return _decode


class PySlotWriter:
    def __init__(self, buffer, ring_offset: int, capacity: int, margin: int, near_end,
                 unrecorded):
        self._mm = buffer
        self._ring_offset = ring_offset
        self._capacity = capacity
        self._margin = margin  # past ready - margin, a writer calls near_end(at)
        self._near_end = near_end  # (at) -> False when the disk is full
        self._unrecorded = unrecorded  # () -> -1, counting an event not written
        self.ready = 0  # file bytes backed by disk, set by the owner as it reserves
        self.starved = False
        self._events = itertools.count()  # next() is atomic under the GIL

    def append(self, kind, op, redop, flags, group_id, callsite_id, seq, peer, tensors_id,
               numel_in, numel_out, t_enter_ns, span_index, name_id) -> int:
        if self.starved:
            return self._unrecorded()
        e = next(self._events)
        at = self._ring_offset + (e % self._capacity) * F.SLOT_SIZE
        if at + self._margin >= self.ready and not self._near_end(at):
            return self._unrecorded()  # `e` stays a hole: readers skip it
        mm = self._mm
        F.U64.pack_into(mm, at, 0)
        F.SLOT_BODY.pack_into(
            mm, at + 8, kind, F.STATUS_IN_FLIGHT, op, redop, flags, 0, 0, group_id,
            callsite_id, seq, peer, tensors_id, numel_in, numel_out, t_enter_ns, 0,
            span_index, name_id, 0,
        )
        F.U64.pack_into(mm, at, e + 1)
        F.U64.pack_into(mm, F.OFF_HEAD, e + 1)
        return e

    def complete(self, e: int, status: int, t_end_ns: int, error_id: int = 0) -> None:
        if e < 0:
            return
        at = self._ring_offset + (e % self._capacity) * F.SLOT_SIZE
        mm = self._mm
        if F.U64.unpack_from(mm, at)[0] != e + 1:
            return  # the slot was reused since
        if error_id:
            F.U32.pack_into(mm, at + F.OFF_SLOT_ERROR, error_id)
        mm[at + F.OFF_SLOT_STATUS] = status
        F.I64.pack_into(mm, at + F.OFF_SLOT_END, t_end_ns)

    def release(self) -> None:
        pass


def make_slot_writer(buffer, ring_offset: int, capacity: int, margin: int, near_end,
                     unrecorded):
    native = native_module()
    if native is not None:
        try:
            return native.SlotWriter(buffer, ring_offset, capacity, margin, near_end,
                                     unrecorded)
        except Exception:
            pass
    return PySlotWriter(buffer, ring_offset, capacity, margin, near_end, unrecorded)
