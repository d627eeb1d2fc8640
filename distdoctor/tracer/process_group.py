"""`TracingProcessGroup`: a ProcessGroup whose collectives are recorded.

Every caller reaches a process group through its virtual methods: `torch.distributed`'s
functions, DDP's C++ reducer, functional collectives and DTensor (which resolve the group
by name in C++), FSDP2 and pipelining. A Python subclass of `ProcessGroup` overrides
those virtuals (pybind11 trampoline), so wrapping the group, not the Python API, sees
all of them. The real backends (gloo, NCCL) are registered on this object exactly as on
a plain group, so `_get_backend`, backend names and options behave as without tracing.

pybind11 detects a Python override calling its base method by the frame's code name,
so each generated method's code object carries the method's own name.
"""

from __future__ import annotations

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from distdoctor.tracer import state
from distdoctor.tracer.ops import SPECS

RealProcessGroup = dist.ProcessGroup

_BACKEND_TYPES = {
    "gloo": RealProcessGroup.BackendType.GLOO,
    "nccl": RealProcessGroup.BackendType.NCCL,
    "ucc": RealProcessGroup.BackendType.UCC,
    "mpi": RealProcessGroup.BackendType.MPI,
}


class TracingProcessGroup(RealProcessGroup):
    def __init__(self, *args):
        # torch builds groups as ProcessGroup(store, rank, size); only the (rank, size)
        # constructor supports Python subclasses, so the store is kept here.
        store = None
        if len(args) == 3:
            store, *args = args
        super().__init__(*args)
        self._dd_store = store
        self._dd_group_id = 0
        self._dd_seq = 0
        self._dd_p2p_seq: dict = {}
        self._dd_backends: list = []  # (device, backend type, backend)

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

    # --- pieces of ProcessGroup that need the store this object cannot hold ----------
    def _register_backend(self, device, backend_type, backend):
        self._dd_backends.append((device, backend_type, backend))
        return super()._register_backend(device, backend_type, backend)

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
        btype = _BACKEND_TYPES.get(backend.name(), RealProcessGroup.BackendType.CUSTOM)
        traced._register_backend(device, btype, backend)
    default = _BACKEND_TYPES.get(pg._get_backend_name())
    if default is not None:
        traced._set_default_backend(default)
    traced._set_group_name(pg.group_name)
    traced._set_group_desc(pg.group_desc)
    if pg.bound_device_id is not None:
        traced.bound_device_id = pg.bound_device_id
    return traced


def _make_method(spec):
    base = getattr(RealProcessGroup, spec.method)

    def method(self, *args, **kwargs):
        rec = state.recorder
        if rec is None or rec.nested():
            return base(self, *args, **kwargs)
        token = rec.begin(self, spec, args, kwargs)
        try:
            work = base(self, *args, **kwargs)
        except BaseException as exc:
            rec.fail(token, exc)
            raise
        rec.end(token, work)
        return work

    method.__code__ = method.__code__.replace(co_name=spec.method)
    method.__name__ = method.__qualname__ = spec.method
    method.__doc__ = f"{base.__doc__}\n\n(recorded by distdoctor as {spec.op!r})"
    return method


for _spec in SPECS:
    setattr(TracingProcessGroup, _spec.method, _make_method(_spec))
