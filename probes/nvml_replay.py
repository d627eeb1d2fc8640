"""Recorded NVML readings: a replay binding and a recording binding, one fixture format.

`ReplayNvml(path)` is a pynvml-shaped binding that answers every NVML call the probe makes
from a JSON fixture, so `NvmlProbe(ReplayNvml(path))` runs the very code the live probe runs.
Its snapshots carry `source="replay:<file name>"`: replayed readings are never shown as live.
`RecordingNvml(pynvml)` wraps the real binding and writes what it answers in the same format
(see record_nvml.py).

Fixture format ("distdoctor-nvml-fixture", version 1):

    {"format": "distdoctor-nvml-fixture", "version": 1,
     "constructed": false,          # true: built by hand from documented values, not recorded
     "note": "...", "meta": {...},  # host, driver, when, what load
     "devices": [{"index": 0, "uuid": "GPU-...", "pci_bus_id": "...", "name": "...",
                  "calls": {CALL_KEY: VALUE}}],          # calls whose answer does not change
     "frames": [{"t": 0.0,                                # seconds from the first frame
                 "devices": [{CALL_KEY: VALUE}, ...],     # per device, by index
                 "xids": [{"device": 0, "xid": 79}]}]}

CALL_KEY is the pynvml function name plus its arguments after the device handle, each as
"/" + compact JSON: "nvmlDeviceGetClockInfo/1". VALUE is the raw NVML answer (structs as
objects of their fields) or {"nvml_error": CODE}. A call missing from the fixture answers
NVML_ERROR_NOT_SUPPORTED, as a GPU that lacks the feature would.
"""

from __future__ import annotations

import ctypes
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

FORMAT = "distdoctor-nvml-fixture"
VERSION = 1
STATIC_CALLS = frozenset({"nvmlDeviceGetUUID", "nvmlDeviceGetName", "nvmlDeviceGetPciInfo",
                          "nvmlDeviceGetMaxClockInfo", "nvmlDeviceGetTemperatureThreshold"})
_NOT_SUPPORTED = 3
_TIMEOUT = 10
_INVALID_ARGUMENT = 2
_NOT_FOUND = 6


def call_key(name: str, args: tuple | list) -> str:
    return name + "".join("/" + json.dumps(a, separators=(",", ":")) for a in args)


def _nvml_error_class() -> type[Exception]:
    try:
        import pynvml

        return pynvml.NVMLError
    except ImportError:  # pragma: no cover - nvidia-ml-py is a dependency
        class NVMLError(Exception):
            def __init__(self, value: int):
                super().__init__(f"NVML error {value}")
                self.value = value

        return NVMLError


def encode(value: Any) -> Any:
    """An NVML answer as JSON: ctypes structs and unions as objects, arrays as lists."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if isinstance(value, (ctypes.Structure, ctypes.Union)):
        return {f[0]: encode(getattr(value, f[0])) for f in value._fields_}
    if isinstance(value, (ctypes.Array, list, tuple)):
        return [encode(v) for v in value]
    if isinstance(value, SimpleNamespace):  # a replayed struct
        return {k: encode(v) for k, v in vars(value).items()}
    return repr(value)


def _decode(value: Any) -> Any:
    if isinstance(value, dict):
        return SimpleNamespace(**{k: _decode(v) for k, v in value.items()})
    if isinstance(value, list):
        return [_decode(v) for v in value]
    return value


class ReplayHandle:
    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index

    def __repr__(self) -> str:
        return f"ReplayHandle({self.index})"


def load_fixture(path: str | os.PathLike) -> dict:
    data = json.loads(Path(path).read_text())
    if data.get("format") != FORMAT or not isinstance(data.get("version"), int):
        raise ValueError(f"{path}: not a distdoctor NVML fixture")
    if data["version"] > VERSION:
        raise ValueError(f"{path}: fixture version {data['version']} is newer than {VERSION}")
    return data


class ReplayNvml:
    """pynvml-shaped binding answering from a fixture.

    The frame follows the clock (seconds since nvmlInit against the frames' "t", looping when
    `loop`), unless pinned with `set_frame(i)`.
    """

    def __init__(self, path: str | os.PathLike, *, loop: bool = True,
                 clock: Callable[[], float] = time.monotonic):
        self.path = Path(path)
        self.data = load_fixture(path)
        self.source = f"replay:{self.path.name}"
        self.constructed = bool(self.data.get("constructed"))
        self.NVMLError = _nvml_error_class()
        self._loop, self._clock = loop, clock
        self._t0: float | None = None
        self._pinned: int | None = None
        self._xids_served: set[int] = set()

    # -- frames ------------------------------------------------------------------------
    @property
    def frame_count(self) -> int:
        return len(self.data["frames"])

    def set_frame(self, i: int | None) -> None:
        """Pin the frame (None: follow the clock again)."""
        self._pinned = i

    def frame_index(self) -> int:
        if self._pinned is not None:
            return min(self._pinned, self.frame_count - 1)
        frames = self.data["frames"]
        elapsed = 0.0 if self._t0 is None else self._clock() - self._t0
        span = frames[-1]["t"] - frames[0]["t"]
        if self._loop and span > 0:
            step = span / max(1, len(frames) - 1)
            elapsed %= span + step
        i = 0
        for j, f in enumerate(frames):
            if f["t"] - frames[0]["t"] <= elapsed:
                i = j
        return i

    def _raise(self, code: int):
        raise self.NVMLError(code)

    # -- global calls ------------------------------------------------------------------
    def nvmlInit(self) -> None:
        if self._t0 is None:
            self._t0 = self._clock()

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return len(self.data["devices"])

    def nvmlSystemGetDriverVersion(self) -> str:
        return str(self.data.get("meta", {}).get("driver", "replay"))

    def nvmlDeviceGetHandleByIndex(self, index: int) -> ReplayHandle:
        if not 0 <= index < len(self.data["devices"]):
            self._raise(_INVALID_ARGUMENT)
        return ReplayHandle(index)

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> ReplayHandle:
        return self._find("uuid", uuid)

    def nvmlDeviceGetHandleByPciBusId(self, bus_id: str) -> ReplayHandle:
        return self._find("pci_bus_id", bus_id)

    def _find(self, key: str, value: str) -> ReplayHandle:
        for d in self.data["devices"]:
            if str(d.get(key, "")).lower() == str(value).lower():
                return ReplayHandle(d["index"])
        self._raise(_NOT_FOUND)

    def nvmlDeviceGetIndex(self, handle: ReplayHandle) -> int:
        return handle.index

    def nvmlEventSetCreate(self) -> str:
        return "replay-event-set"

    def nvmlDeviceRegisterEvents(self, handle, types, event_set) -> None:
        pass

    def nvmlEventSetFree(self, event_set) -> None:
        pass

    def nvmlEventSetWait_v2(self, event_set, timeout_ms: int) -> SimpleNamespace:
        """The current frame's XIDs, each served once."""
        i = self.frame_index()
        for n, x in enumerate(self.data["frames"][i].get("xids") or []):
            if (i, n) not in self._xids_served:
                self._xids_served.add((i, n))
                return SimpleNamespace(device=ReplayHandle(x["device"]), eventType=0x8,
                                       eventData=x["xid"], gpuInstanceId=0, computeInstanceId=0)
        self._raise(_TIMEOUT)

    # -- device calls ------------------------------------------------------------------
    def __getattr__(self, name: str) -> Callable[..., Any]:
        if not name.startswith("nvmlDevice"):
            raise AttributeError(name)

        def device_call(handle: ReplayHandle, *args: Any) -> Any:
            key = call_key(name, args)
            frame = self.data["frames"][self.frame_index()]["devices"]
            per_frame = frame[handle.index] if handle.index < len(frame) else {}
            if key in per_frame:
                value = per_frame[key]
            else:
                value = self.data["devices"][handle.index].get("calls", {}).get(
                    key, {"nvml_error": _NOT_SUPPORTED})
            if isinstance(value, dict) and set(value) == {"nvml_error"}:
                self._raise(value["nvml_error"])
            return _decode(value)

        device_call.__name__ = name
        return device_call


class RecordingNvml:
    """Wraps pynvml; every device call's answer (or error) goes into the current frame."""

    def __init__(self, nvml: Any):
        self._nvml = nvml
        self.NVMLError = nvml.NVMLError
        self.devices: list[dict] = []
        self.frames: list[dict] = []
        self._addr: dict[int, int] = {}  # handle address -> index

    def new_frame(self, t: float) -> None:
        self.frames.append({"t": round(t, 3), "devices": [{} for _ in self.devices],
                            "xids": []})

    def _index_of(self, handle: Any) -> int | None:
        try:
            return self._addr.get(ctypes.cast(handle, ctypes.c_void_p).value)
        except (TypeError, ctypes.ArgumentError):
            return None

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        h = self._nvml.nvmlDeviceGetHandleByIndex(index)
        self._addr[ctypes.cast(h, ctypes.c_void_p).value] = index
        while len(self.devices) <= index:
            self.devices.append({"index": len(self.devices), "calls": {}})
        return h

    def nvmlEventSetWait_v2(self, event_set: Any, timeout_ms: int) -> Any:
        ev = self._nvml.nvmlEventSetWait_v2(event_set, timeout_ms)
        idx = self._index_of(ev.device)
        if self.frames and idx is not None:
            self.frames[-1]["xids"].append({"device": idx, "xid": int(ev.eventData)})
        return ev

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self._nvml, name)
        if not name.startswith("nvmlDevice") or not callable(fn):
            return fn

        def recorded(*args: Any) -> Any:
            idx = self._index_of(args[0]) if args else None
            try:
                value = fn(*args)
                stored = encode(value)
            except self._nvml.NVMLError as e:
                value, stored = e, {"nvml_error": getattr(e, "value", _NOT_SUPPORTED)}
            if idx is not None:
                key = call_key(name, [encode(a) for a in args[1:]])
                dev = self.devices[idx]
                if name in STATIC_CALLS:
                    dev["calls"][key] = stored
                    if name == "nvmlDeviceGetUUID" and isinstance(stored, str):
                        dev["uuid"] = stored
                    elif name == "nvmlDeviceGetName" and isinstance(stored, str):
                        dev["name"] = stored
                    elif name == "nvmlDeviceGetPciInfo" and isinstance(stored, dict):
                        dev["pci_bus_id"] = stored.get("busId")
                elif self.frames:
                    self.frames[-1]["devices"][idx][key] = stored
            if isinstance(value, Exception):
                raise value
            return value

        return recorded

    def fixture(self, *, note: str, meta: dict) -> dict:
        return {"format": FORMAT, "version": VERSION, "constructed": False, "note": note,
                "meta": meta, "devices": self.devices, "frames": self.frames}
