"""Issuing a traced op through torch's c10d dispatcher op, where ProcessGroup hooks fire.

torch 2.15 added pre/post hooks on a ProcessGroup (`register_pre_hook`,
`register_post_hook`; `PreHookArgs`, `PostHookArgs`, `HookOpName`) and attaches its own
through them: `FlightRecorderHook` (the only Flight Recorder nccl2 has), `NanCheckHook`.
The hooks are not fired by the ProcessGroup's methods nor by the backend: "They are
invoked from the dispatcher kernels (Ops.cpp) rather than here, so they fire wherever a
c10d op is dispatched" (torch 2.15.0, `torch/csrc/distributed/c10d/ProcessGroup.hpp`,
beside `preHooks_`). A tracer that hands an op straight to the backend's binding (see
process_group.py) skips them: in a 2-rank gloo job they fired 14 times per rank bare and
0 times traced.

Why the dispatcher op and not the hooks run by the tracer: the hooks live in C++
(`std::map<int64_t, PreHook>` on the group) with no Python accessor, `PreHookArgs` cannot
be built from Python, and the op ids come from the group's own counter
(`hookOpIdCounter_`). Calling the dispatcher op (`torch.ops.c10d.allreduce_`, ...) is the
very path ProcessGroup's C++ methods take (`op.call(...)` in each method of
ProcessGroup.hpp): the same kernel fires the same hooks with the same arguments, in the
same order, with the same op id and the `Work` in the post hook; a `TorchDispatchMode`
(CommDebugMode) sees the op as it does bare. And, unlike the base method a Python
override can call (`WORK_OVERRIDE` in `py/PyProcessGroup.hpp` calls it with the GIL
held, which deadlocks against gloo's worker thread), a `torch.ops` call releases the GIL
while the kernel runs.

Arguments come from each op's schema, read at import: tensors in the method's order,
then the group (boxed, once per group), then each remaining argument by its schema name,
from the method's options (`reduce_op`, `root_rank`, `async_op`, `timeout`, ...) or its
own trailing arguments (`dst`, `tag`, split sizes). After the op, the in-flight work is
registered where torch's method registers it (`allow_inflight_collective_as_graph_input`).

Only on a torch whose ProcessGroup has `register_pre_hook` (feature-detected); anything
this module cannot place returns None and the caller takes the base method's path,
which fires the hooks too.
"""

from __future__ import annotations

from datetime import timedelta

import torch
import torch.distributed as dist

HOOKS = hasattr(dist.ProcessGroup, "register_pre_hook")

# ProcessGroup method -> its c10d dispatcher op (torch 2.15.0, ProcessGroup.hpp)
_OPS = {
    "allreduce": "allreduce_", "allreduce_coalesced": "allreduce_coalesced_",
    "broadcast": "broadcast_", "reduce": "reduce_", "allgather": "allgather_",
    "all_gather_single": "_allgather_base_", "allgather_coalesced": "allgather_coalesced_",
    "all_gather_single_coalesced": "allgather_into_tensor_coalesced_",
    "gather": "gather_", "gather_single": "gather_into_tensor_", "scatter": "scatter_",
    "reduce_scatter": "reduce_scatter_", "reduce_scatter_single": "_reduce_scatter_base_",
    "reduce_scatter_single_coalesced": "reduce_scatter_tensor_coalesced_",
    "alltoall": "alltoall_", "all_to_all_single": "alltoall_base_",
    "barrier": "barrier", "send": "send", "recv": "recv_",
    "recv_anysource": "recv_any_source_",
}
_MS = timedelta(milliseconds=1)


def _timeout_ms(opts) -> int:
    return opts.timeout // _MS  # C++: opts.timeout.count(); unset is -1 ms


# schema argument -> how torch's C++ method fills it from the options
_FROM_OPTS = {
    "reduce_op": lambda o: o.reduceOp.boxed(),
    "root_rank": lambda o: o.rootRank,
    "root_tensor": lambda o: o.rootTensor,
    "sparse_indices": lambda o: getattr(o, "sparseIndices", None),
    "async_op": lambda o: o.asyncOp,
    "timeout": _timeout_ms,
    "device_ids": lambda o: list(o.device_ids),
}


class _Plan:
    """One op's schema read once: how many tensor arguments lead, which trailing
    arguments of the method come next, and which are read from the options."""

    def __init__(self, op, method: str):
        self.op = op
        names = [a.name for a in op._schema.arguments]
        self.n_tensors = names.index("process_group")
        self.rest = names[self.n_tensors + 1:]
        self.barrier = method == "barrier"
        if self.barrier:
            self.n_tensors = 0  # the method makes the tensor (see `barrier_device`)

    def arguments(self, pg, call_args, barrier_device):
        if self.barrier:
            opts = call_args[0] if call_args else None
            device = getattr(opts, "device", None) or barrier_device(pg)
            lead = [torch.empty(1, dtype=torch.uint8, device=device)]
        else:
            lead = list(call_args[:self.n_tensors])
            opts = call_args[-1] if len(call_args) > self.n_tensors else None
        trailing = list(call_args[self.n_tensors:])
        out = [*lead, _boxed(pg)]
        for name in self.rest:
            reader = _FROM_OPTS.get(name)
            if reader is not None and type(opts).__name__.endswith("Options"):
                out.append(reader(opts))
            elif trailing and not self.barrier:
                out.append(trailing.pop(0))
            else:
                return None  # not a form this module knows: the base path takes it
        return out, lead


def _boxed(pg):
    """The group as the dispatcher takes it, boxed once per group (the script object
    holds the C++ group, not the Python one: no cycle)."""
    boxed = pg.__dict__.get("_dd_boxed")
    if boxed is None:
        boxed = pg.__dict__["_dd_boxed"] = pg.boxed()
    return boxed


def _plans() -> dict:
    if not HOOKS:
        return {}
    plans = {}
    for method, name in _OPS.items():
        packet = getattr(torch.ops.c10d, name, None) if hasattr(torch.ops, "c10d") else None
        try:
            plans[method] = _Plan(packet.default, method)
        except Exception:
            continue  # this torch lacks the op, or its schema is not one we can place
    return plans


# Read on the first op, not at import: the tracer is imported while torch itself is
# still being imported (tracer/install.py), before torch.ops exists.
_plans_read: dict = {}


def plan_for(method: str):
    if not _plans_read:
        _plans_read.update(_plans() or {"": None})
    return _plans_read.get(method)


def _inflight_on() -> bool:
    check = getattr(torch._C._distributed_c10d,
                    "_allow_inflight_collective_as_graph_input", None)
    return check is not None and check()


def torch_hooks_attached(pg) -> bool:
    """Whether torch attached hooks of its own to this group (torch 2.15.0
    distributed_c10d.py, `_new_process_group_helper`): its Flight Recorder hook (kept in
    `_world.pg_flight_recorder_hooks`; nccl2, nccl-lazy, plugins) or, with
    TORCH_DIST_NAN_CHECK=1, NanCheckHook on every group. HealthCheckHook is an abort
    hook, not fired per op. A hook the job registers from Python is seen by the tracing
    group's own register_pre_hook/register_post_hook."""
    cached = pg.__dict__.get("_dd_torch_hooks")
    if cached is None:
        import os

        import torch.distributed.distributed_c10d as c10d

        recorded = getattr(c10d._world, "pg_flight_recorder_hooks", {})
        cached = pg in recorded or os.environ.get("TORCH_DIST_NAN_CHECK", "0") == "1"
        if cached or c10d._world.pg_map.get(pg) is not None:  # torch is done with it
            pg.__dict__["_dd_torch_hooks"] = cached
    return cached


def prepare(pg, spec, call_args, desc, barrier_device):
    """(the dispatcher op, its arguments, tensors its work is registered on), or None
    where this op is not routed (no hooks on this torch, an unknown argument form).
    Everything that can fail runs here, before the op is issued."""
    plan = plan_for(spec.method)
    if plan is None or call_args is None:
        return None
    if spec.method == "monitored_barrier":
        return None
    built = plan.arguments(pg, call_args, barrier_device)
    if built is None:
        return None
    args, lead = built
    ins, outs = desc[0], desc[1]
    return plan.op, args, (lead if plan.barrier else (outs or ins))


def issue(prepared):
    """Run the dispatcher op (it fires the group's pre and post hooks) and return its
    Work as the ProcessGroup method returns it."""
    op, args, tensors = prepared
    result = op(*args)
    boxed = result[-1] if isinstance(result, tuple) else result
    work = dist.Work.unbox(boxed) if boxed is not None else None
    if work is not None and _inflight_on():  # as torch's method does after op.call
        for tensor in tensors:
            torch._C._distributed_c10d._register_work(tensor, work)
    return work
