"""NVML probe: per-GPU temperature, clocks, power, load, memory, clock-event reasons, errors.

Every NVML call goes through one choke point, `NvmlProbe.call`: NVML is initialised lazily,
an NVML error becomes the "not available" value (None), and a function the GPU or driver does
not support is logged once and not asked again. The NVML *binding* is swappable: the live
probe uses pynvml (nvidia-ml-py); `ReplayNvml` (probes/nvml_replay.py) replays recorded
readings through this same code, and its snapshots say so (`source="replay:<file>"`).

Without an NVIDIA driver the probe says "no NVIDIA driver" once per process and reports no
GPUs; nothing else changes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from distdoctor.probes.nvml_values import (
    NA,
    VIOLATION_POLICIES,
    GpuIdentity,
    GpuSnapshot,
    decode_reasons,
)

log = logging.getLogger("distdoctor.probes.nvml")

NO_DRIVER = "no NVIDIA driver"

# NVML return codes (nvml.h)
ERROR_UNINITIALIZED = 1
ERROR_NOT_SUPPORTED = 3
ERROR_NO_PERMISSION = 4
ERROR_TIMEOUT = 10
ERROR_FUNCTION_NOT_FOUND = 13
_UNSUPPORTED = (ERROR_NOT_SUPPORTED, ERROR_FUNCTION_NOT_FOUND)

# nvml.h constants, numeric so any binding (live or replay) can be used
TEMPERATURE_GPU = 0
THRESHOLD_SHUTDOWN = 0
THRESHOLD_SLOWDOWN = 1
CLOCK_SM = 1
MEMORY_ERROR_CORRECTED = 0
MEMORY_ERROR_UNCORRECTED = 1
VOLATILE_ECC = 0
EVENT_XID_CRITICAL = 0x8  # nvmlEventTypeXidCriticalError
FI_PCIE_TX_BYTES = 197  # NVML_FI_DEV_PCIE_COUNT_TX_BYTES
FI_PCIE_RX_BYTES = 198
FI_NVLINK_TX_KIB = 138  # NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX; scope UINT_MAX = all links
FI_NVLINK_RX_KIB = 139
ALL_LINKS = 0xFFFFFFFF
FIELDS = (FI_PCIE_TX_BYTES, FI_PCIE_RX_BYTES, (FI_NVLINK_TX_KIB, ALL_LINKS),
          (FI_NVLINK_RX_KIB, ALL_LINKS))
FIELD_NAMES = ("pcie_tx_bytes", "pcie_rx_bytes", "nvlink_tx_kib", "nvlink_rx_kib")
MAX_XIDS_PER_SNAPSHOT = 32

_said_no_driver = False
_said_lock = threading.Lock()


def _say_no_driver(reason: str) -> None:
    """Once per process: GPU probes are off, and why."""
    global _said_no_driver
    with _said_lock:
        if _said_no_driver:
            return
        _said_no_driver = True
    log.warning("distdoctor: %s (%s): GPU probes are off; host and process probes still run",
                NO_DRIVER, reason)


def load_pynvml() -> Any | None:
    try:
        import pynvml
    except ImportError:
        return None
    return pynvml


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    return str(value)


class NvmlProbe:
    """Reads every GPU of this node into `GpuSnapshot`s. Thread-safe; never raises NVML errors.

    `binding` is a pynvml-shaped module or object (functions named like pynvml's and an
    `NVMLError` with `.value`); None means the real pynvml (source "live").
    """

    def __init__(self, binding: Any | None = None, *, source: str | None = None,
                 xid_events: bool = True, clock: Callable[[], float] = time.time):
        if binding is None:
            binding, source = load_pynvml(), "live"
        self._nvml = binding
        self.source = source or getattr(binding, "source", None) or "live"
        self.xid_events = xid_events
        self.clock = clock
        self.unavailable_reason: str | None = None
        self._ready: bool | None = None  # None: not tried yet
        self._unsupported: set[tuple] = set()
        self._logged: set[tuple] = set()
        self._devices: list[GpuIdentity] = []
        self._handles: list[Any] = []
        self._static: list[dict] = []
        self._event_set: Any = None
        self._lock = threading.RLock()

    # -- the choke point ---------------------------------------------------------------
    def call(self, name: str, *args: Any, dev: int | None = None,
             quiet: Iterable[int] = ()) -> Any:
        """`binding.<name>(*args)`, or None when NVML cannot say. `dev` is the device index
        (for remembering per device what is unsupported); `quiet` return codes are expected
        (e.g. a timeout) and not logged."""
        if not self._ensure_init():
            return NA
        key = (name, dev, repr(args[1:] if dev is not None else args))
        if key in self._unsupported:
            return NA
        fn = getattr(self._nvml, name, None)
        if fn is None:
            self._unsupported.add(key)
            self._log_once((name,), logging.INFO, "NVML binding has no %s; reported as N/A", name)
            return NA
        try:
            return fn(*args)
        except Exception as e:  # NVMLError and anything odd from a binding: N/A
            code = getattr(e, "value", None)
            if code in tuple(quiet):
                return NA
            if code in _UNSUPPORTED:
                self._unsupported.add(key)
                self._log_once((name,), logging.INFO, "%s is not supported here (%s); "
                               "reported as N/A", name, e)
            else:
                self._log_once((name, code), logging.WARNING, "%s failed (%s); reported as N/A",
                               name, e)
            return NA

    def _log_once(self, key: tuple, level: int, msg: str, *args: Any) -> None:
        if key not in self._logged:
            self._logged.add(key)
            log.log(level, msg, *args)

    # -- initialisation ----------------------------------------------------------------
    def _ensure_init(self) -> bool:
        if self._ready is not None:
            return self._ready
        with self._lock:
            if self._ready is not None:
                return self._ready
            if self._nvml is None:
                return self._off("nvidia-ml-py is not installed")
            try:
                self._nvml.nvmlInit()
            except Exception as e:
                return self._off(str(e) or type(e).__name__)
            self._ready = True
            self._discover()
            return True

    def _off(self, reason: str) -> bool:
        self.unavailable_reason = f"{NO_DRIVER} ({reason})"
        self._ready = False
        _say_no_driver(reason)
        return False

    def _discover(self) -> None:
        count = self.call("nvmlDeviceGetCount") or 0
        for i in range(count):
            h = self.call("nvmlDeviceGetHandleByIndex", i)
            if h is None:
                continue
            pci = self.call("nvmlDeviceGetPciInfo", h, dev=i)
            bus = _text(getattr(pci, "busId", None)) if pci is not None else None
            self._devices.append(GpuIdentity(
                index=i, uuid=_text(self.call("nvmlDeviceGetUUID", h, dev=i)),
                pci_bus_id=bus, name=_text(self.call("nvmlDeviceGetName", h, dev=i))))
            self._handles.append(h)
            self._static.append({
                "max_sm_clock_mhz": self.call("nvmlDeviceGetMaxClockInfo", h, CLOCK_SM, dev=i),
                "slowdown_c": self.call("nvmlDeviceGetTemperatureThreshold", h,
                                        THRESHOLD_SLOWDOWN, dev=i),
                "shutdown_c": self.call("nvmlDeviceGetTemperatureThreshold", h,
                                        THRESHOLD_SHUTDOWN, dev=i),
            })
        if self.xid_events and self._handles:
            self._register_xids()

    def _register_xids(self) -> None:
        es = self.call("nvmlEventSetCreate")
        if es is None:
            return
        for ident, h in zip(self._devices, self._handles, strict=False):
            self.call("nvmlDeviceRegisterEvents", h, EVENT_XID_CRITICAL, es, dev=ident.index)
        self._event_set = es

    # -- public ------------------------------------------------------------------------
    @property
    def available(self) -> bool:
        return self._ensure_init()

    def devices(self) -> list[GpuIdentity]:
        """This node's GPUs in NVML order (empty without NVML)."""
        self._ensure_init()
        return list(self._devices)

    def snapshot(self, indices: Iterable[int] | None = None) -> tuple[GpuSnapshot, ...]:
        """One reading of every GPU (or of the NVML indices given)."""
        if not self._ensure_init():
            return ()
        with self._lock:
            wanted = None if indices is None else set(indices)
            xids = self._drain_xids()
            out = []
            for ident, h, static in zip(self._devices, self._handles, self._static, strict=False):
                if wanted is None or ident.index in wanted:
                    out.append(self._read(ident, h, static, xids.get(ident.index, ())))
            return tuple(out)

    def close(self) -> None:
        with self._lock:
            if self._ready:
                if self._event_set is not None:
                    self.call("nvmlEventSetFree", self._event_set)
                self.call("nvmlShutdown")
            self._ready, self._devices, self._handles, self._static = None, [], [], []
            self._event_set = None

    # -- reading one GPU ---------------------------------------------------------------
    def _read(self, ident: GpuIdentity, h: Any, static: dict, xids) -> GpuSnapshot:
        i = ident.index

        def c(name: str, *args: Any) -> Any:
            return self.call(name, h, *args, dev=i)

        util = c("nvmlDeviceGetUtilizationRates")
        mem = c("nvmlDeviceGetMemoryInfo")
        power = c("nvmlDeviceGetPowerUsage")  # mW
        limit = c("nvmlDeviceGetEnforcedPowerLimit")  # mW
        mask = self._reasons_mask(h, i)
        return GpuSnapshot(
            t=self.clock(), source=self.source, index=i, uuid=ident.uuid,
            pci_bus_id=ident.pci_bus_id, name=ident.name,
            temperature_c=c("nvmlDeviceGetTemperature", TEMPERATURE_GPU),
            slowdown_c=static["slowdown_c"], shutdown_c=static["shutdown_c"],
            sm_clock_mhz=c("nvmlDeviceGetClockInfo", CLOCK_SM),
            max_sm_clock_mhz=static["max_sm_clock_mhz"],
            power_w=None if power is None else round(power / 1000.0, 3),
            power_limit_w=None if limit is None else round(limit / 1000.0, 3),
            utilization_pct=getattr(util, "gpu", None),
            memory_utilization_pct=getattr(util, "memory", None),
            memory_used_bytes=getattr(mem, "used", None),
            memory_total_bytes=getattr(mem, "total", None),
            reasons_mask=mask, reasons=decode_reasons(mask),
            violation_ns=self._violations(h, i),
            energy_mj=c("nvmlDeviceGetTotalEnergyConsumption"),
            ecc_corrected=c("nvmlDeviceGetTotalEccErrors", MEMORY_ERROR_CORRECTED, VOLATILE_ECC),
            ecc_uncorrected=c("nvmlDeviceGetTotalEccErrors", MEMORY_ERROR_UNCORRECTED,
                              VOLATILE_ECC),
            xids=tuple(xids), **self._fields(h, i))

    def _reasons_mask(self, h: Any, i: int) -> int | None:
        """Current clock-event reasons; the pre-535 driver name where the new one is missing."""
        new = ("nvmlDeviceGetCurrentClocksEventReasons", i, "()")
        if new not in self._unsupported:
            mask = self.call(new[0], h, dev=i)
            if mask is not None or new not in self._unsupported:
                return mask
        return self.call("nvmlDeviceGetCurrentClocksThrottleReasons", h, dev=i)

    def _violations(self, h: Any, i: int) -> dict[str, int]:
        out = {}
        for name, policy in VIOLATION_POLICIES.items():
            v = self.call("nvmlDeviceGetViolationStatus", h, policy, dev=i)
            t = getattr(v, "violationTime", None)
            if t is not None:
                out[name] = int(t)
        return out

    def _fields(self, h: Any, i: int) -> dict[str, int | None]:
        out: dict[str, int | None] = dict.fromkeys(FIELD_NAMES)
        values = self.call("nvmlDeviceGetFieldValues", h, list(FIELDS), dev=i)
        for name, fv in zip(FIELD_NAMES, values or (), strict=False):
            if getattr(fv, "nvmlReturn", 1) == 0:
                out[name] = int(fv.value.ullVal)
        return out

    def _drain_xids(self) -> dict[int, list[int]]:
        """XID events since the last snapshot, by device index (never waits)."""
        out: dict[int, list[int]] = {}
        if self._event_set is None:
            return out
        for _ in range(MAX_XIDS_PER_SNAPSHOT):
            ev = self.call("nvmlEventSetWait_v2", self._event_set, 0, quiet=(ERROR_TIMEOUT,))
            if ev is None:
                break
            idx = self.call("nvmlDeviceGetIndex", ev.device)
            if idx is not None:
                out.setdefault(int(idx), []).append(int(ev.eventData))
        return out
