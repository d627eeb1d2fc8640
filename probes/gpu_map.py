"""Which GPU serves which rank: local rank -> CUDA device -> NVML device (by UUID or PCI bus).

CUDA numbers the devices a process may see through CUDA_VISIBLE_DEVICES: a comma-separated
list of NVML indices or GPU UUIDs (a unique prefix such as "GPU-8932f937" is enough), read up
to the first invalid entry; unset means every GPU. NVML numbers GPUs in PCI bus order, as CUDA
does with CUDA_DEVICE_ORDER=PCI_BUS_ID; CUDA's default order ("fastest first") is the same on
nodes of identical GPUs, which is where distributed training runs. A rank uses CUDA device
`local_rank` (torchrun's convention), or device 0 when it sees exactly one GPU.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from distdoctor.probes.nvml_values import GpuIdentity


def parse_visible_devices(value: str | None) -> list[str] | None:
    """CUDA_VISIBLE_DEVICES as CUDA reads it; None when unset (every GPU visible)."""
    if value is None:
        return None
    out: list[str] = []
    for raw in value.split(","):
        entry = raw.strip()
        if entry.isdigit():
            out.append(str(int(entry)))
        elif entry.upper().startswith(("GPU-", "MIG-")) and len(entry) > 4:
            out.append(entry)
        else:
            break  # CUDA ignores this entry and everything after it ("-1", "", junk)
    return out


def cuda_index_for_local_rank(local_rank: int | None,
                              visible: Sequence[str] | None) -> int | None:
    """The CUDA device a rank uses by convention."""
    if visible is not None and len(visible) == 1:
        return 0
    if local_rank is None or local_rank < 0:
        return None
    if visible is not None and local_rank >= len(visible):
        return None
    return local_rank


def normalize_bus_id(bus_id: str | None) -> str | None:
    """"00000000:18:00.0" and "0000:18:00.0" -> "0000:18:00.0" (domain:bus:device.function)."""
    if not bus_id:
        return None
    try:
        domain, bus, rest = bus_id.strip().lower().split(":")
        dev, fn = rest.split(".")
        return f"{int(domain, 16):04x}:{int(bus, 16):02x}:{int(dev, 16):02x}.{int(fn, 16)}"
    except ValueError:
        return bus_id.strip().lower()


def _by_uuid(devices: Sequence[GpuIdentity], uuid: str) -> GpuIdentity | None:
    want = uuid.strip().lower()
    if not want.startswith("gpu-"):
        want = "gpu-" + want
    hits = [d for d in devices if d.uuid and d.uuid.lower().startswith(want)]
    return hits[0] if len(hits) == 1 else None  # an ambiguous prefix names no GPU


def resolve_gpu(devices: Sequence[GpuIdentity], *, local_rank: int | None = None,
                cuda_index: int | None = None, cuda_visible_devices: str | None = None,
                uuid: str | None = None, pci_bus_id: str | None = None) -> GpuIdentity | None:
    """The NVML device a rank uses, or None when it cannot be told.

    A UUID or PCI bus id the rank reported wins; otherwise the CUDA device (given, or by the
    local-rank convention) is looked up through CUDA_VISIBLE_DEVICES.
    """
    if uuid:
        found = _by_uuid(devices, uuid)
        if found:
            return found
    if pci_bus_id:
        want = normalize_bus_id(pci_bus_id)
        for d in devices:
            if normalize_bus_id(d.pci_bus_id) == want:
                return d
    visible = parse_visible_devices(cuda_visible_devices)
    if cuda_index is None:
        cuda_index = cuda_index_for_local_rank(local_rank, visible)
    if cuda_index is None or cuda_index < 0:
        return None
    if visible is None:
        entry = str(cuda_index)
    elif cuda_index < len(visible):
        entry = visible[cuda_index]
    else:
        return None
    if entry.isdigit():
        return next((d for d in devices if d.index == int(entry)), None)
    if entry.upper().startswith("GPU-"):
        return _by_uuid(devices, entry)
    return None  # MIG instance: NVML's MIG handles are not mapped (yet)


def rank_gpus(devices: Sequence[GpuIdentity],
              ranks: Mapping[int, Mapping]) -> dict[int, GpuIdentity]:
    """rank -> GPU for this node's ranks. Each rank's mapping may hold "local_rank",
    "cuda_visible_devices", "cuda_device", "gpu_uuid" and "pci_bus_id" (the rank metadata
    the tracer writes, or a rank process's environment)."""
    out: dict[int, GpuIdentity] = {}
    for rank, info in ranks.items():
        gpu = resolve_gpu(devices, local_rank=_int(info.get("local_rank")),
                          cuda_index=_int(info.get("cuda_device")),
                          cuda_visible_devices=info.get("cuda_visible_devices"),
                          uuid=info.get("gpu_uuid"), pci_bus_id=info.get("pci_bus_id"))
        if gpu is not None:
            out[rank] = gpu
    return out


def _int(value) -> int | None:
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError):
        return None
