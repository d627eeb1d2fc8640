"""Coalesced ops under tracing: `batch_isend_irecv` coalesces as it does untraced, and the
ops issued inside a coalesced batch complete with the batch's Work.

Recent torch's `batch_isend_irecv` coalesces only `if type(group) is ProcessGroup and
group._get_backend(device).supports_coalescing` (torch 2.13.0 distributed_c10d.py:3049);
older torch coalesced every CUDA batch. A traced group is a subclass, so on NCCL every
batch went out as separate sends and receives: no ncclGroupStart/End around them. Each
send then waits on the GPU for its peer's receive, which the peer queued behind its own
send on the same stream: two pipeline stages exchanging activations larger than NCCL's
buffer (the interleaved 1F1B's send_forward_recv_backward) hang, where untraced they run.
The batch is coalesced here exactly as torch does it (its own `_coalescing_manager`, its
own loop issuing each op), only for the group torch would have coalesced were it plain.

Inside a coalesced batch NCCL returns no Work per op (`ProcessGroupNCCL::pointToPoint`
under `coalescing_state_`); the batch's one Work comes from `_end_coalescing`. Each op's
event is held until then and completes with it, not at the point of issue.
"""

from __future__ import annotations

import functools
import time

from distdoctor.runlog import format as F
from distdoctor.tracer.support import warn_once


def closed_to_subclasses(batch_isend_irecv) -> bool:
    """Does torch's `batch_isend_irecv` coalesce plain ProcessGroups only? Read from its
    code, not its version: it calls the builtin `type` and loads `ProcessGroup` (torch
    2.13.0 does). Not the older `device.type == "cuda"` test (an attribute, no
    ProcessGroup), nor an `isinstance` test (proposed upstream, pytorch#178906), which a
    traced group passes: wrapping those would open a second coalescing around torch's."""
    import dis

    code = getattr(_unwrapped(batch_isend_irecv), "__code__", None)
    if code is None or "supports_coalescing" not in code.co_names:
        return False
    try:
        loaded = {i.argval for i in dis.get_instructions(code) if i.opname == "LOAD_GLOBAL"}
    except Exception:
        return False
    return {"type", "ProcessGroup"} <= loaded


def patch_batch_isend_irecv(c10d, traced_class) -> None:
    """`c10d.batch_isend_irecv` (and `torch.distributed`'s name for it, where that module
    already holds it) coalescing traced groups as torch coalesces plain ones."""
    import sys

    original = getattr(c10d, "batch_isend_irecv", None)
    if original is None or not closed_to_subclasses(original):
        return

    @functools.wraps(original)
    def batch_isend_irecv(p2p_op_list):
        try:
            group = p2p_op_list[0].group
            group = c10d._get_default_group() if group is None else group
            device = p2p_op_list[0].tensor.device
            coalesce = (type(group) is traced_class
                        and group._get_backend(device).supports_coalescing)
        except Exception:  # torch's own function says what is wrong with the list
            coalesce = False
        if not coalesce:
            return original(p2p_op_list)
        with c10d._coalescing_manager(group, device, async_ops=True) as cm:
            original(p2p_op_list)  # its loop for groups it does not coalesce itself
        return cm.works

    c10d.batch_isend_irecv = batch_isend_irecv
    dist = sys.modules.get("torch.distributed")
    if dist is not None and getattr(dist, "batch_isend_irecv", None) is original:
        dist.batch_isend_irecv = batch_isend_irecv


def _unwrapped(fn):
    while hasattr(fn, "__wrapped__"):
        fn = fn.__wrapped__
    return fn


def batch_ended(recorder, events: list[int], work, exc: BaseException | None) -> None:
    """The ops of a coalesced batch (`events`) complete as its Work does; when ending the
    batch raised, they failed with it."""
    for e in events:
        try:
            if exc is not None:
                recorder._finish(e, exc)
            elif work is None:
                recorder.ring.complete(e, F.STATUS_OK, time.monotonic_ns())
            else:
                recorder._pending.add_work(e, work)
        except Exception as err:
            warn_once("end", f"could not follow a coalesced op's completion: {err!r}")
