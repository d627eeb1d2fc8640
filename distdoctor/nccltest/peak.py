"""The NVLink peak of a GPU, per direction, from NVML: link generation x active links.

Every NVML call goes through `_nvml`, which turns any NVML problem (no library, no driver,
a function the GPU does not support) into "not available" rather than an exception.
"""

from __future__ import annotations

# nvmlDeviceGetNvLinkVersion returns an nvmlNvlinkVersion_t enum, not the generation
# (an A100 reports 5, "3.1"): enum -> (generation, GB/s per link per direction).
LINK_VERSIONS = {
    1: ("1.0", 20.0),  # P100
    2: ("2.0", 25.0),  # V100
    3: ("2.2", 25.0),
    4: ("3.0", 25.0),  # A100
    5: ("3.1", 25.0),  # A100
    6: ("4.0", 25.0),  # H100, H200: 18 links, 450 GB/s
    7: ("5.0", 50.0),  # B200: 18 links, 900 GB/s
}


def nvml_bus_id(domain: int, bus: int, device: int) -> str:
    """NVML's PCI bus id spelling for a device torch describes by numbers."""
    return f"{domain:08X}:{bus:02X}:{device:02X}.0"


def nvlink_peak(bus_id: str | None, index: int = 0) -> tuple[float | None, str]:
    """(GB/s per direction, how it was found) or (None, why not)."""
    try:
        import pynvml
    except ImportError:
        return None, "NVML not available (nvidia-ml-py not installed)"
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - no driver, no GPU: a value, not an error
        return None, f"NVML not available ({exc})"
    try:
        return _peak(pynvml, bus_id, index)
    except Exception as exc:  # noqa: BLE001
        return None, f"NVML could not tell ({exc})"
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001, S110
            pass


def _peak(pynvml, bus_id: str | None, index: int) -> tuple[float | None, str]:
    if bus_id:
        handle = pynvml.nvmlDeviceGetHandleByPciBusId(bus_id)
    else:
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    active, version = 0, None
    for link in range(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18)):
        try:
            state = pynvml.nvmlDeviceGetNvLinkState(handle, link)
        except pynvml.NVMLError:
            continue  # link absent or not supported on this GPU
        if state == pynvml.NVML_FEATURE_ENABLED:
            active += 1
            if version is None:
                version = pynvml.nvmlDeviceGetNvLinkVersion(handle, link)
    if not active:
        return None, "no active NVLink (PCIe only)"
    if version not in LINK_VERSIONS:
        return None, f"NVLink version code {version} is not in the table"
    generation, per_link = LINK_VERSIONS[version]
    return active * per_link, f"NVLink {generation} x {active} links, from NVML"
