"""Which process groups the tracer builds: decided from torch's own backend registry.

torch 2.15 builds NCCL under several names: "nccl" (ProcessGroupNCCL2 by default, the
legacy ProcessGroupNCCL with TORCH_DIST_USE_NCCL2=0), "nccl2", "nccl-lazy",
"nccl-legacy", each also inside a mixed string ("cpu:gloo,cuda:nccl2"). The three new
names are registered as `BackendType.CUSTOM` by torch's own registrars, lazily, through
the `torch.distributed.backends` entry points (torch 2.15.0 distributed_c10d.py,
`_register_builtin_*_backend`, `Backend._ensure_backend_registered`). A list of names of
our own would miss the next one, so a group is traced when every device's backend in it
is one torch builds itself:

- its type in `Backend.backend_type_map` is a built-in one (gloo, nccl, ucc, mpi, xccl:
  every torch from the floor), or
- its `Backend._plugins` entry was registered by torch.distributed's own module (nccl2,
  nccl-lazy, nccl-legacy, and on 2.15 gloo and nccl too).

A plugin from elsewhere (a Python ProcessGroup such as the "threaded" or "fake" test
backends, a vendor's plugin) may replace the group wholesale, and stays untraced as before.
The string is split per device by torch's own `BackendConfig`, which also registers the
names it meets, exactly as `_new_process_group_helper` is about to.
"""

from __future__ import annotations


def device_backends(c10d, backend: str) -> dict[str, str]:
    """{device: backend name} as torch will read the string (its BackendConfig); a
    single name is only registered (BackendConfig would warn about an unknown plugin's
    devices, which torch is about to do itself)."""
    if "," not in backend and ":" not in backend and backend != "undefined":
        ensure = getattr(c10d.Backend, "_ensure_backend_registered", None)
        if ensure is not None:  # torch >= 2.15: names register on first use
            ensure(backend)
        return {"": backend}
    return {str(device): str(name).lower()
            for device, name in c10d.BackendConfig(backend).get_device_backend_map().items()}


def torch_builds(c10d, name: str) -> bool:
    """Whether `name` is a backend torch itself registers (see the module docstring)."""
    registry = c10d.Backend
    types = c10d.ProcessGroup.BackendType
    own_types = {getattr(types, t) for t in ("GLOO", "NCCL", "UCC", "MPI", "XCCL")
                 if hasattr(types, t)}
    if registry.backend_type_map.get(name) in own_types:
        return True
    plugin = getattr(registry, "_plugins", {}).get(name.upper())
    creator = getattr(plugin, "creator_fn", None)
    return getattr(creator, "__module__", None) == c10d.__name__


def traced_backend(c10d, backend: str) -> bool:
    """Whether a group built from this backend string is traced."""
    per_device = device_backends(c10d, backend)
    return bool(per_device) and all(torch_builds(c10d, n) for n in per_device.values())


def real_names(pg) -> dict[str, str]:
    """What each device's backend of a group calls itself ({"cuda": "nccl2"}): the name
    a user gave may build another implementation ("nccl" on torch 2.15)."""
    names = {}
    try:
        for device in pg._device_types:
            names[str(device)] = pg._get_backend(device).name()
    except Exception:
        pass
    return names
