"""Where torch decides by a group's exact class, a traced group (a subclass) is treated
as the plain group it stands for.

torch 2.13.0 tests `type(group) is ProcessGroup` twice (distributed_c10d.py):

- `batch_isend_irecv` coalesces a batch (NCCL's groupStart/groupEnd around its sends and
  receives) only for a plain group (line 3049); older torch coalesced every CUDA batch.
  A traced NCCL batch went out op by op: each send waits on the GPU for its peer's
  receive, which the peer queued behind its own send on the same stream, so two pipeline
  stages exchanging activations larger than NCCL's buffer (the interleaved 1F1B's
  send_forward_recv_backward) hang where untraced they run. The batch is coalesced here
  as torch does it (its own `_coalescing_manager`, its own loop issuing each op). Inside
  a coalesced batch NCCL returns no Work per op; the batch's one Work comes from
  `_end_coalescing`, and each op's event completes with it (`batch_ended`).
- `destroy_process_group` waits for the Works whose Python on-completion hooks are still
  to run (`_register_on_completion_hook`, NCCL only) only for a plain group (line 2394):
  torch's comment says why, a hook run once the interpreter is gone crashes taking the
  GIL. A traced group's are waited for here, as torch would.

Each patch is made only where torch's function makes that test, read from its bytecode,
not its version: a test that lets subclasses in (`isinstance`, proposed upstream as
pytorch#178906) needs nothing, and the batch would otherwise be coalesced twice.
"""

from __future__ import annotations

import functools
import time

from distdoctor.runlog import format as F
from distdoctor.tracer.support import warn_once


def closed_to_subclasses(fn, uses: str = "supports_coalescing") -> bool:
    """Does torch's `fn` test `type(...) is ProcessGroup` beside its use of `uses`? It
    calls the builtin `type` and loads `ProcessGroup` (globals), and names `uses`. Not
    the older `device.type == "cuda"` (an attribute, no ProcessGroup), nor `isinstance`."""
    import dis
    import inspect

    try:
        code = getattr(inspect.unwrap(fn), "__code__", None)  # (ValueError: a loop)
        if code is None or uses not in code.co_names:
            return False
        loaded = {i.argval for i in dis.get_instructions(code) if i.opname == "LOAD_GLOBAL"}
    except Exception:
        return False
    return {"type", "ProcessGroup"} <= loaded


def patch_batch_isend_irecv(c10d, traced_class) -> None:
    """`c10d.batch_isend_irecv` (and `torch.distributed`'s name for it, where that module
    already holds it) coalescing traced groups as torch coalesces plain ones."""
    original = getattr(c10d, "batch_isend_irecv", None)
    if original is None or not closed_to_subclasses(original):
        return

    @functools.wraps(original)
    def batch_isend_irecv(p2p_op_list):
        try:
            # the list checked before the batch opens, as torch checks it: a bad list
            # raised inside an open batch would leave NCCL's group open on this thread
            check = getattr(c10d, "_check_p2p_op_list", None)
            if check is not None:
                check(p2p_op_list)
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

    _replace(c10d, "batch_isend_irecv", original, batch_isend_irecv)


def patch_destroy_process_group(c10d, traced_class) -> None:
    """`destroy_process_group` waiting, for a traced group, for the Works whose Python
    on-completion hooks are still to run, as it waits for a plain group's."""
    original = getattr(c10d, "destroy_process_group", None)
    if original is None or not closed_to_subclasses(original, "_has_hooks"):
        return

    @functools.wraps(original)
    def destroy_process_group(group=None):
        try:
            pg = c10d.GroupMember.WORLD if group is None else group
            if (type(pg) is traced_class and c10d._world.pg_map.get(pg) is not None
                    and pg._has_hooks()):
                pg._wait_for_pending_works()
        except Exception:  # torch's own function says what is wrong with the group
            pass
        return original(group)

    _replace(c10d, "destroy_process_group", original, destroy_process_group)


def _replace(c10d, name: str, original, wrapper) -> None:
    """`name` in c10d, and in `torch.distributed` where that module already holds it."""
    import sys

    setattr(c10d, name, wrapper)
    dist = sys.modules.get("torch.distributed")
    if dist is not None and getattr(dist, name, None) is original:
        setattr(dist, name, wrapper)


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
