"""`TracingProcessGroup`: a ProcessGroup whose collectives are recorded.

Every caller reaches a process group through its virtual methods: `torch.distributed`'s
functions, DDP's C++ reducer, functional collectives and DTensor (which resolve the group
by name in C++), FSDP2 and pipelining. A Python subclass of `ProcessGroup` overrides
those virtuals (pybind11 trampoline), so wrapping the group, not the Python API, sees
all of them. The real backends (gloo, NCCL) are registered on this object exactly as on
a plain group, so `_get_backend`, backend names and options behave as without tracing.

Each op is passed straight to the device's backend through the backend's own Python
binding, which releases the GIL while the op is enqueued. Calling the ProcessGroup base
method instead would go through pybind11's trampoline with the GIL held, and deadlock
against gloo's worker thread, which takes the GIL to free a finished op's tensors while
holding the queue lock the new op needs. The two coalesced "single" ops have no backend
binding: on CPU they run as one bound backend op per tensor pair, joined into one Work
(the base path hung an 8-rank TP job within 5 steps). Only ops with neither take the
base path; pybind11 recognises a Python override calling its base by the
frame's code name, so each generated method's code object carries its name.

On a torch whose groups carry pre/post hooks (2.15: torch's own Flight Recorder for
nccl2, its NaN check, the user's hooks), each op goes instead through its c10d
dispatcher op, whose kernel fires them as it does bare and releases the GIL as the
backend binding does: dispatch.py says why that and not the hooks run by hand.

Backend names and types come from torch's registry (`Backend.backend_type_map`), never a
list of our own: "nccl2", "nccl-lazy", "nccl-legacy" are registered as CUSTOM there.
"""

from __future__ import annotations

import threading

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from distdoctor.runlog.slots import native_module
from distdoctor.tracer import dispatch, state
from distdoctor.tracer.exact_class import batch_ended
from distdoctor.tracer.ops import TRACED

RealProcessGroup = dist.ProcessGroup


def backend_type(name: str, registry=None):
    """The BackendType torch registers `name` under (CUSTOM for "nccl2", "nccl-lazy",
    "nccl-legacy" and plugins; torch 2.15.0 distributed_c10d.py, _register_builtin_*),
    or CUSTOM for a name it does not know."""
    registry = registry or c10d.Backend
    custom = RealProcessGroup.BackendType.CUSTOM
    return getattr(registry, "backend_type_map", {}).get(str(name).lower(), custom)


def barrier_device_type(default_type) -> str:
    """The device of a barrier with no device given, chosen as ProcessGroup::barrier
    does (torch 2.15.0 ProcessGroup.hpp): by the group's default backend *type*, CUDA
    for NCCL, XPU for XCCL, else the CPU (so a group named "nccl2", CUSTOM, is CPU)."""
    types = RealProcessGroup.BackendType
    if default_type == types.NCCL:
        return "cuda"
    if default_type == getattr(types, "XCCL", None):
        return "xpu"
    return "cpu"


class TracingProcessGroup(RealProcessGroup):
    def __repr__(self) -> str:
        # torch puts a group in its error messages ("Global rank 2 is not part of group
        # <...>"): the job's output reads as it would without distdoctor
        real = RealProcessGroup
        return f"<{real.__module__}.{real.__qualname__} object at {id(self):#x}>"

    def __init__(self, *args):
        # torch builds groups as ProcessGroup(store, rank, size), before torch 2.6 with
        # the group's Options fourth; only the (rank, size) constructor supports Python
        # subclasses, so the store and options are kept here.
        store = options = None
        if len(args) in (3, 4):
            store, *args = args
        if len(args) == 3:
            *args, options = args
        super().__init__(*args)
        self._dd_store = store
        self._dd_options = options
        self._dd_group_id = 0
        self._dd_seq = 0
        self._dd_p2p_seq: dict = {}
        self._dd_backends: list = []  # (device, backend type, backend)
        self._dd_bound: dict = {}  # (method, device type) -> the backend's bound method
        self._dd_default_type = None  # the default backend's type, as torch set it

    def _set_default_backend(self, backend_type):
        self._dd_default_type = backend_type
        return super()._set_default_backend(backend_type)

    def _dd_default_backend_type(self):
        if self._dd_default_type is not None:
            return self._dd_default_type
        return backend_type(self._get_backend_name())

    def register_pre_hook(self, *args, **kwargs):
        self._dd_hooked = True
        return super().register_pre_hook(*args, **kwargs)

    def register_post_hook(self, *args, **kwargs):
        self._dd_hooked = True
        return super().register_post_hook(*args, **kwargs)

    def _dd_dispatch_call(self, spec, desc, args, kwargs):
        """The op through its c10d dispatcher op (hooks fire there), or None: only for
        a group that may carry hooks, since that entry costs ~80 us more per op than the
        backend's binding (docs/tracer.md)."""
        if not (self.__dict__.get("_dd_hooked") or dispatch.torch_hooks_attached(self)):
            return None
        return dispatch.prepare(self, spec, spec.positional(args, kwargs), desc,
                                _barrier_device)

    def _dd_describe(self, recorder) -> int:
        """Intern this group's identity (name, description, global ranks) once."""
        try:
            ranks = c10d._world.pg_group_ranks.get(self)
            ranks = sorted(ranks, key=ranks.get) if ranks else []
        except Exception:
            ranks = []
        name, desc = self.group_name, self.group_desc
        self._dd_group_id = recorder.intern(
            "group", (name, desc, tuple(ranks)),
            {"name": name, "desc": desc, "ranks": ranks, "size": self.size()})
        return self._dd_group_id

    def _dd_backend_call(self, spec, desc, args, kwargs):
        """The backend's bound method for this op and its positional arguments, or None."""
        if spec.backend_method is None:
            return None
        call_args = spec.positional(args, kwargs) if kwargs else args
        if call_args is None:
            return None
        key = (spec.method, _device_type_of(spec, desc, self))
        bound = self._dd_bound.get(key)
        if bound is None:
            backend = self._get_backend(_torch_device(key[1]))
            bound = self._dd_bound[key] = getattr(backend, spec.backend_method)
        return bound, call_args

    # --- a coalesced batch: its ops end with its Work (exact_class.py) -----------------
    def _start_coalescing(self, device):
        started = super()._start_coalescing(device)
        rec = state.recorder
        if rec is not None:  # (a batch whose body raised was never ended: dropped)
            rec.coalescing[threading.get_ident()] = []
        return started

    def _end_coalescing(self, device):
        rec = state.recorder
        events = rec.coalescing.pop(threading.get_ident(), []) if rec is not None else []
        try:
            work = super()._end_coalescing(device)
        except BaseException as exc:
            batch_ended(rec, events, None, exc)  # (no recorder: no events)
            raise
        batch_ended(rec, events, work, None)
        return work

    # --- pieces of ProcessGroup that need the store this object cannot hold ----------
    def _register_backend(self, device, backend_type, backend):
        self._dd_backends.append((device, backend_type, backend))
        self._dd_bound.clear()
        return super()._register_backend(device, backend_type, backend)

    def getBackendName(self):
        """The backend's name. Before torch 2.6 the C++ base reads it from the group's
        Options, which a (rank, size)-built group lacks, and pybind11 asks this override."""
        if self._dd_options is not None:
            return self._dd_options.backend
        for _device, _type, backend in self._dd_backends:
            return backend.name()
        return "undefined"

    def get_group_store(self):
        return self._dd_store if self._dd_store is not None else super().get_group_store()

    def split_group(self, *args, **kwargs):
        """Split through a plain twin that holds the store, then trace the result."""
        split = self._dd_twin().split_group(*args, **kwargs)
        return adopt(split) if split is not None else None

    def merge_remote_group(self, *args, **kwargs):
        return adopt(self._dd_twin().merge_remote_group(*args, **kwargs))

    def _dd_twin(self):
        twin = RealProcessGroup(self._dd_store, self.rank(), self.size())
        for device, backend_type, backend in self._dd_backends:
            twin._register_backend(device, backend_type, backend)
        twin._set_group_name(self.group_name)
        twin._set_group_desc(self.group_desc)
        if self.bound_device_id is not None:
            twin.bound_device_id = self.bound_device_id
        return twin


def adopt(pg):
    """A TracingProcessGroup sharing `pg`'s backends (for groups torch built in C++)."""
    if isinstance(pg, TracingProcessGroup) or pg is None:
        return pg
    traced = TracingProcessGroup(pg.rank(), pg.size())
    traced._dd_store = pg.get_group_store()
    for device in pg._device_types:
        backend = pg._get_backend(device)
        traced._register_backend(device, backend_type(backend.name()), backend)
    default = backend_type(pg._get_backend_name())
    if hasattr(traced, "_set_default_backend"):  # torch >= 2.6
        traced._set_default_backend(default)
    traced._set_group_name(pg.group_name)
    traced._set_group_desc(pg.group_desc)
    if pg.bound_device_id is not None:
        traced.bound_device_id = pg.bound_device_id
    return traced


def _torch_device(device_type: str):
    import torch

    return torch.device(device_type)


def _device_type_of(spec, desc, pg) -> str:
    """The device whose backend runs this op, chosen as ProcessGroup's C++ does."""
    ins, outs, opts, _ = desc
    for t in ins or outs:
        # is_cpu is a flag; .device makes a device object per call (~0.3 us)
        return "cpu" if t.is_cpu else t.device.type
    if spec.method == "barrier":
        device = getattr(opts, "device", None)
        if device is not None:
            return device.type
        return barrier_device_type(pg._dd_default_backend_type())
    return "cpu"  # monitored_barrier runs on the CPU backend


def _barrier_device(pg):
    return _torch_device(barrier_device_type(pg._dd_default_backend_type()))


def _dispatch_coalesced(pg, op, args, kwargs):
    """reduce_scatter_tensor_coalesced / all_gather_into_tensor_coalesced on CPU, as one
    backend op per tensor pair (each releases the GIL; see the module docstring) joined
    into one Work; None when the arguments do not fit, and then the base path is taken.
    Same results: each pair is reduced or gathered exactly as the coalesced op does."""
    import torch

    if kwargs or len(args) != 3:
        return None
    outputs, inputs, opts = args
    if not outputs or len(outputs) != len(inputs) or outputs[0].device.type != "cpu":
        return None  # CUDA: NCCL has no worker thread that takes the GIL; base path is safe
    from torch._C import _distributed_c10d as c10d_C

    # everything that can fail is prepared before the first op is issued: a failure
    # here falls back to the base path, never half-issued ops
    try:
        backend = pg._get_backend(torch.device("cpu"))
        calls = []
        for out, inp in zip(outputs, inputs, strict=True):
            if op == "reduce_scatter_tensor_coalesced":
                one = c10d_C.ReduceScatterOptions()
                one.reduceOp = opts.reduceOp
                calls.append((backend._reduce_scatter_base, out, inp, one))
            else:
                one = c10d_C.AllgatherOptions()
                calls.append((backend._allgather_base, out, inp, one))
            one.timeout, one.asyncOp = opts.timeout, opts.asyncOp
    except Exception:
        return None
    works = [call(out, inp, one) for call, out, inp, one in calls]
    # not at the top: this module is imported while torch.distributed is still being
    # imported (tracer/install.py), before it has dist.Work for work.py to subclass
    from distdoctor.tracer.work import JoinedWork

    return JoinedWork(works)


_DISPATCHED = ("reduce_scatter_tensor_coalesced", "all_gather_into_tensor_coalesced")


def _make_method(spec):
    base = getattr(RealProcessGroup, spec.method)

    def method(self, *args, **kwargs):
        routed = direct = None
        try:
            desc = spec.describe(args, kwargs)
            if dispatch.HOOKS:  # the group's hooks fire in the dispatcher op's kernel
                routed = self._dd_dispatch_call(spec, desc, args, kwargs)
            if routed is None:
                direct = self._dd_backend_call(spec, desc, args, kwargs)
        except Exception:
            desc = routed = direct = None
        rec = state.recorder
        token = rec.begin(self, spec, desc) if rec is not None and desc else None
        try:
            if routed is not None:
                work = dispatch.issue(routed)
            elif direct is not None:
                work = direct[0](*direct[1])
            elif spec.op in _DISPATCHED and (
                    work := _dispatch_coalesced(self, spec.op, args, kwargs)) is not None:
                pass
            else:
                work = base(self, *args, **kwargs)
        except BaseException as exc:
            if rec is not None:
                rec.fail(token, exc)
            raise
        if rec is not None:
            try:
                work = rec.end(token, work)
            except Exception:
                # a synchronous op that failed in the recorder's wait (recorded there):
                # the caller's own wait raises it again, from the caller's line, and
                # the job's traceback has no frame of distdoctor's (as the C path)
                pass
        return work

    method.__code__ = method.__code__.replace(co_name=spec.method)
    method.__name__ = method.__qualname__ = spec.method
    method.__doc__ = f"{base.__doc__}\n\n(recorded by distdoctor as {spec.op!r})"
    return method


# How the C path (runlog/_fast.c, TracedMethod) reads each op's positional arguments;
# any other op it hands to spec.describe, and ops with no backend method (or barriers,
# whose device the group chooses) always to the Python method.
_FORMS = {None: 3, "inplace": 1, "out_in": 2}


def _traced_method(spec):
    """The method to put on TracingProcessGroup for `spec`: the Python method, or where
    the C extension is built (and DISTDOCTOR_PURE_PYTHON unset) a C method that runs the
    common case itself and hands everything else to the Python method (_fast.c says
    which)."""
    method = _make_method(spec)
    native = native_module()
    if native is None or not hasattr(native, "TracedMethod"):
        return method
    form = _FORMS.get(getattr(spec.describe, "form", None), 3)
    if spec.backend_method is None or spec.method in ("barrier", "monitored_barrier"):
        form = 0
    try:
        return native.TracedMethod(method, spec, form, vars(state), dispatch.HOOKS)
    except Exception:
        return method


# Each op under the name this torch binds it by (tracer/ops.py: TRACED); an op this torch
# lacks is not there to trace.
for _spec in TRACED:
    setattr(TracingProcessGroup, _spec.method, _traced_method(_spec))
