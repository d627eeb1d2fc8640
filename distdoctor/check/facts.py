"""What one rank can see of itself and its node, as plain JSON-able data.

Nothing here talks to the other ranks, and nothing raises: a fact that cannot be read is
None (and the rule that needs it says "n/a").
"""

from __future__ import annotations

import os
import platform
import resource
import socket
import tempfile

SETTING_PREFIXES = ("NCCL_", "GLOO_", "TORCH_NCCL_", "TORCH_DISTRIBUTED_", "TORCH_GLOO_")
SHM_ENV = "DISTDOCTOR_CHECK_SHM"  # test hook: a small tmpfs standing in for /dev/shm
NVML_REPLAY_ENV = "DISTDOCTOR_NVML_REPLAY"  # test hook: recorded NVML readings


def gather(checkpoint_dir: str | None) -> dict:
    """This rank's facts."""
    env = os.environ
    return {
        "rank": _int(env.get("RANK")), "local_rank": _int(env.get("LOCAL_RANK")),
        "host": socket.gethostname(), "pid": os.getpid(),
        "versions": versions(),
        "settings": {k: v for k, v in env.items() if k.startswith(SETTING_PREFIXES)},
        "interfaces": _safe(lambda: sorted(name for _, name in socket.if_nameindex())),
        "hcas": _listdir("/sys/class/infiniband"),
        "shm": disk(env.get(SHM_ENV) or "/dev/shm"),
        "checkpoint": disk(checkpoint_dir, write=True) if checkpoint_dir else None,
        "limits": {"nofile": _limit(resource.RLIMIT_NOFILE),
                   "memlock": _limit(resource.RLIMIT_MEMLOCK)},
        "memory": _memory(),
        "cuda_visible_devices": env.get("CUDA_VISIBLE_DEVICES"),
        "device": device(),
        "affinity": _safe(lambda: sorted(os.sched_getaffinity(0))),
    }


def versions() -> dict:
    import torch

    out = {"python": platform.python_version(), "torch": torch.__version__,
           "cuda": torch.version.cuda, "nccl": None, "cudnn": None}
    if torch.cuda.is_available():
        out["nccl"] = _safe(lambda: ".".join(map(str, torch.cuda.nccl.version())))
        out["cudnn"] = _safe(lambda: str(torch.backends.cudnn.version()))
    return out


def device() -> dict:
    """The GPU this rank will use: torchrun's convention, the LOCAL_RANK-th visible one
    (the only one when each rank sees one). `physical`: its index among the node's GPUs,
    read from CUDA_VISIBLE_DEVICES without CUDA (so a duplicate shows on any machine)."""
    local = _int(os.environ.get("LOCAL_RANK")) or 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    listed = [v.strip() for v in visible.split(",") if v.strip()] if visible else None
    out = {"ordinal": None, "physical": None, "exists": None, "uuid": None, "pci": None,
           "numa_node": None, "numa_cpus": None, "count": 0}
    if listed is not None:
        out["ordinal"] = local if len(listed) > 1 else 0
        out["physical"] = listed[out["ordinal"]] if out["ordinal"] < len(listed) else None
        out["exists"] = out["physical"] is not None
    try:
        import torch

        if torch.cuda.is_available():
            count = torch.cuda.device_count()
            ordinal = local if listed is None or len(listed) > 1 else 0
            out.update(count=count, ordinal=ordinal, exists=ordinal < count)
            if listed is None:
                out["physical"] = str(ordinal)
            if ordinal < count:
                props = torch.cuda.get_device_properties(ordinal)
                out["uuid"] = str(getattr(props, "uuid", "") or "") or None
                bus = f"{props.pci_domain_id:04x}:{props.pci_bus_id:02x}:" \
                      f"{props.pci_device_id:02x}.0"
                out["pci"] = bus
                out["numa_node"] = _numa_of(bus)
                if out["numa_node"] is not None and out["numa_node"] >= 0:
                    out["numa_cpus"] = _cpulist(out["numa_node"])
    except Exception:  # a broken CUDA setup is itself a finding, not a crash
        out["exists"] = False if out["exists"] is None else out["exists"]
    return out


def gpus() -> dict | None:
    """The node's GPUs through the NVML probe (`source` says live or replay), read by
    local rank 0 only: None where there is no NVIDIA driver."""
    from distdoctor.probes.nvml import NvmlProbe

    replay = os.environ.get(NVML_REPLAY_ENV)
    if replay:
        from distdoctor.probes.nvml_replay import ReplayNvml

        binding = ReplayNvml(replay)
        binding.set_frame(binding.frame_count - 1)  # the state the recording ends in
        probe = NvmlProbe(binding, source=f"replay:{os.path.basename(replay)}")
    else:
        probe = NvmlProbe()
    try:
        if not probe.available:
            return None
        out = []
        for s in probe.snapshot():
            row = {k: getattr(s, k) for k in (
                "index", "uuid", "pci_bus_id", "name", "temperature_c", "slowdown_c",
                "sm_clock_mhz", "max_sm_clock_mhz", "utilization_pct", "reasons_mask",
                "ecc_uncorrected", "source")}
            row["reasons"] = list(s.reasons)
            row["xids"] = list(s.xids)
            row["persistence"] = probe.call("nvmlDeviceGetPersistenceMode", dev=s.index)
            remapped = probe.call("nvmlDeviceGetRemappedRows", dev=s.index)
            row["remap_failed"] = (bool(remapped[3]) if isinstance(remapped, (list, tuple))
                                   and len(remapped) > 3 else None)
            row["retired_pending"] = probe.call("nvmlDeviceGetRetiredPagesPendingStatus",
                                                dev=s.index)
            out.append(row)
        return {"gpus": out}
    finally:
        probe.close()


def disk(path: str | None, write: bool = False) -> dict | None:
    if not path:
        return None
    out = {"path": path, "exists": os.path.isdir(path), "total": None, "free": None,
           "writable": None}
    try:
        st = os.statvfs(path)
        out["total"], out["free"] = st.f_blocks * st.f_frsize, st.f_bavail * st.f_frsize
    except OSError:
        return out
    if write:
        try:
            with tempfile.NamedTemporaryFile(dir=path, prefix=".distdoctor-check-") as f:
                f.write(b"x")
                f.flush()
            out["writable"] = True
        except OSError as exc:
            out["writable"] = False
            out["error"] = exc.strerror or str(exc)
    return out


def _memory() -> dict | None:
    try:
        import psutil

        vm = psutil.virtual_memory()
        return {"total": vm.total, "available": vm.available}
    except Exception:
        return None


def _limit(which: int) -> list:
    soft, hard = resource.getrlimit(which)
    return [None if soft == resource.RLIM_INFINITY else soft,
            None if hard == resource.RLIM_INFINITY else hard]


def _numa_of(bus: str) -> int | None:
    try:
        with open(f"/sys/bus/pci/devices/{bus.lower()}/numa_node") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def _cpulist(node: int) -> list[int] | None:
    try:
        with open(f"/sys/devices/system/node/node{node}/cpulist") as f:
            return parse_cpulist(f.read())
    except (OSError, ValueError):
        return None


def parse_cpulist(text: str) -> list[int]:
    """'0-3,8-11' -> [0, 1, 2, 3, 8, 9, 10, 11]."""
    out = []
    for part in text.strip().split(","):
        if part:
            lo, _, hi = part.partition("-")
            out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def _listdir(path: str) -> list[str] | None:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return None


def _int(text) -> int | None:
    try:
        return int(text)
    except (TypeError, ValueError):
        return None


def _safe(fn):
    try:
        return fn()
    except Exception:
        return None
