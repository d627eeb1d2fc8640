"""What the NVML probe reads: immutable per-GPU snapshots and the clock-event reason bits.

A value NVML could not give (unsupported, GPU lost, no permission) is `None` in a snapshot
and prints as "N/A": a missing value is a value, not an exception.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any

from distdoctor.probes.checked import checked_fields

NA = None  # the "not available" value
NA_TEXT = "N/A"

# nvmlClocksEventReason* (formerly nvmlClocksThrottleReason*) bit values, from nvml.h.
# tests/test_probes_nvml.py checks them against the installed pynvml's constants.
REASON_BITS: dict[str, int] = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clock_setting": 0x100,
    "board_limit": 0x200,  # nvmlClocksThrottleReasonBoardLimit (newer drivers)
    "reliability": 0x400,  # nvmlClocksThrottleReasonReliability (newer drivers)
}
REASON_LABELS: dict[str, str] = {
    "gpu_idle": "GPU idle",
    "applications_clocks_setting": "applications clocks setting",
    "sw_power_cap": "SW power cap",
    "hw_slowdown": "HW slowdown",
    "sync_boost": "sync boost",
    "sw_thermal_slowdown": "SW thermal slowdown",
    "hw_thermal_slowdown": "HW thermal slowdown",
    "hw_power_brake_slowdown": "HW power brake slowdown",
    "display_clock_setting": "display clock setting",
    "board_limit": "board limit",
    "reliability": "reliability",
}
# Reasons that slow a busy GPU down because of heat, power or hardware: the throttle
# detector's business. GPU idle, application/display clocks and sync boost are not faults.
SLOWDOWN_REASONS = frozenset({"sw_power_cap", "hw_slowdown", "sw_thermal_slowdown",
                              "hw_thermal_slowdown", "hw_power_brake_slowdown", "board_limit",
                              "reliability"})

# nvmlDeviceGetViolationStatus perf policies (NVML_PERF_POLICY_*): cumulative time, ns.
VIOLATION_POLICIES: dict[str, int] = {
    "power": 0, "thermal": 1, "sync_boost": 2, "board_limit": 3, "low_utilization": 4,
    "reliability": 5, "app_clocks": 10, "base_clocks": 11,
}


def decode_reasons(mask: int | None) -> tuple[str, ...]:
    """Names of the set clock-event reason bits; unknown bits as "unknown_0x..."."""
    if mask is None:
        return ()
    names = [name for name, bit in REASON_BITS.items() if mask & bit]
    rest = mask & ~sum(REASON_BITS.values())
    bit = 1
    while rest:
        if rest & bit:
            names.append(f"unknown_{bit:#x}")
            rest &= ~bit
        bit <<= 1
    return tuple(names)


def reason_labels(names) -> str:
    """"HW thermal slowdown, SW power cap" for a person."""
    return ", ".join(REASON_LABELS.get(n, n) for n in names) or "none"


def fmt(value: Any, unit: str = "") -> str:
    return NA_TEXT if value is None else f"{value}{unit}"


@dataclass(frozen=True)
class GpuIdentity:
    """One GPU as NVML numbers it: index (PCI bus order), UUID, PCI bus id, name."""

    index: int
    uuid: str | None
    pci_bus_id: str | None
    name: str | None


@dataclass(frozen=True)
class GpuSnapshot:
    """One GPU's readings at one moment. `source` is "live" or "replay:<file>"."""

    t: float  # wall-clock seconds when read
    source: str
    index: int
    uuid: str | None = NA
    pci_bus_id: str | None = NA
    name: str | None = NA
    temperature_c: int | None = NA
    slowdown_c: int | None = NA  # NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
    shutdown_c: int | None = NA  # NVML_TEMPERATURE_THRESHOLD_SHUTDOWN
    sm_clock_mhz: int | None = NA
    max_sm_clock_mhz: int | None = NA
    power_w: float | None = NA
    power_limit_w: float | None = NA  # enforced limit
    utilization_pct: int | None = NA
    memory_utilization_pct: int | None = NA
    memory_used_bytes: int | None = NA
    memory_total_bytes: int | None = NA
    reasons_mask: int | None = NA
    reasons: tuple[str, ...] = ()
    violation_ns: MappingProxyType = field(default_factory=lambda: MappingProxyType({}))
    energy_mj: int | None = NA  # total since driver load
    ecc_corrected: int | None = NA  # volatile (since driver load)
    ecc_uncorrected: int | None = NA
    xids: tuple[int, ...] = ()  # XID events seen since the previous snapshot
    pcie_tx_bytes: int | None = NA  # cumulative counters (NVML field values)
    pcie_rx_bytes: int | None = NA
    nvlink_tx_kib: int | None = NA
    nvlink_rx_kib: int | None = NA

    def __post_init__(self):
        if not isinstance(self.violation_ns, MappingProxyType):
            object.__setattr__(self, "violation_ns", MappingProxyType(dict(self.violation_ns)))
        object.__setattr__(self, "reasons", tuple(self.reasons))
        object.__setattr__(self, "xids", tuple(self.xids))

    @property
    def live(self) -> bool:
        return self.source == "live"

    @property
    def clock_ratio(self) -> float | None:
        if not self.sm_clock_mhz or not self.max_sm_clock_mhz:
            return None
        return self.sm_clock_mhz / self.max_sm_clock_mhz

    def to_json(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["violation_ns"] = dict(self.violation_ns)
        d["reasons"] = list(self.reasons)
        d["xids"] = list(self.xids)
        return d

    @classmethod
    def from_json(cls, d: dict) -> GpuSnapshot:
        return cls(**checked_fields(cls, d))  # a probe file is anyone's text (checked.py)
