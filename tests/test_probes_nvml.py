"""NVML probe: reason bits, the choke point, replay through the live code path, GPU<->rank.

There is no GPU on the test machine. The fixtures in tests/fixtures/nvml/ are CONSTRUCTED, not
recorded: raw NVML answers built from nvml.h's documented units and bit values and an H100's
published limits (tests/fixtures/nvml/make_constructed.py). They go through the very probe
code the live probe runs (`NvmlProbe(ReplayNvml(file))`). Real recordings go beside them, in
tests/fixtures/nvml_recorded/ (benchmarks/gpu_suite.py writes them on a GPU machine;
tests/gpu/test_nvml_recorded_replay.py replays them); these constructed ones stay.
"""

from __future__ import annotations

import ctypes
import json
import logging
from pathlib import Path

import pynvml
import pytest
from distdoctor.probes import nvml as nvml_mod
from distdoctor.probes.gpu_map import parse_visible_devices, rank_gpus, resolve_gpu
from distdoctor.probes.nvml import NvmlProbe
from distdoctor.probes.nvml_replay import RecordingNvml, ReplayHandle, ReplayNvml, call_key
from distdoctor.probes.nvml_values import REASON_BITS, GpuSnapshot, decode_reasons

FIX = Path(__file__).parent / "fixtures" / "nvml"


def replay(name: str) -> tuple[NvmlProbe, ReplayNvml]:
    r = ReplayNvml(FIX / f"{name}.json")
    r.set_frame(0)
    return NvmlProbe(r), r


def test_fixtures_say_they_are_constructed():
    for p in FIX.glob("*.json"):
        data = json.loads(p.read_text())
        assert data["constructed"] is True and "CONSTRUCTED" in data["note"], p


def test_reason_bits_match_installed_pynvml():
    for name, bit in REASON_BITS.items():
        camel = "".join(w.capitalize() for w in name.split("_"))
        camel = camel.replace("Sw", "Sw").replace("Hw", "Hw")
        throttle = getattr(pynvml, f"nvmlClocksThrottleReason{camel}", None)
        event = getattr(pynvml, f"nvmlClocksEventReason{camel}", None)
        assert throttle is not None or event is not None, name
        for value in (throttle, event):
            assert value is None or value == bit, (name, value, bit)
    assert pynvml.nvmlClocksEventReasonHwThermalSlowdown == 0x40
    assert pynvml.nvmlClocksEventReasonSwPowerCap == 0x4


def test_decode_reasons():
    assert decode_reasons(0) == ()
    assert decode_reasons(None) == ()
    assert decode_reasons(0x48) == ("hw_slowdown", "hw_thermal_slowdown")
    assert decode_reasons(0x1) == ("gpu_idle",)
    assert decode_reasons(0x4 | 0x80) == ("sw_power_cap", "hw_power_brake_slowdown")
    assert decode_reasons(0x1000) == ("unknown_0x1000",)


def test_no_nvml_here_says_no_driver_once(caplog, monkeypatch):
    monkeypatch.setattr(nvml_mod, "_said_no_driver", False)
    caplog.set_level(logging.INFO, logger="distdoctor.probes.nvml")
    probes = [NvmlProbe(), NvmlProbe()]
    for p in probes:
        for _ in range(3):
            assert p.snapshot() == ()
        assert p.devices() == [] and not p.available
        assert p.unavailable_reason.startswith("no NVIDIA driver")
    said = [r for r in caplog.records if "no NVIDIA driver" in r.getMessage()]
    assert len(said) == 1


def test_replay_goes_through_the_probe_and_is_never_live():
    probe, r = replay("h100_hw_thermal")
    assert [d.index for d in probe.devices()] == list(range(8))
    r.set_frame(5)
    snaps = probe.snapshot()
    hot = snaps[6]
    assert hot.source == "replay:h100_hw_thermal.json" and not hot.live
    assert (hot.temperature_c, hot.sm_clock_mhz, hot.max_sm_clock_mhz) == (89, 1155, 1980)
    assert hot.reasons == ("hw_slowdown", "hw_thermal_slowdown")
    assert (hot.slowdown_c, hot.shutdown_c) == (89, 92)
    assert hot.power_w == 455.0 and hot.power_limit_w == 700.0  # mW -> W in the probe
    assert hot.utilization_pct == 99 and hot.memory_total_bytes == 81559 << 20
    assert hot.violation_ns["thermal"] == 3_000_000_000
    assert hot.pcie_tx_bytes and hot.nvlink_rx_kib
    assert snaps[0].reasons == () and snaps[0].sm_clock_mhz == 1980
    assert GpuSnapshot.from_json(json.loads(json.dumps(hot.to_json()))) == hot


def test_idle_and_power_cap_fixtures():
    probe, _ = replay("h100_idle")
    idle = probe.snapshot()[0]
    assert idle.reasons == ("gpu_idle",) and idle.utilization_pct == 0
    probe, _ = replay("h100_sw_power_cap")
    capped = probe.snapshot()[1]
    assert capped.reasons == ("sw_power_cap",) and capped.power_w == 699.5


def test_unsupported_call_is_na_and_logged_once(caplog):
    caplog.set_level(logging.INFO, logger="distdoctor.probes.nvml")
    probe, r = replay("h100_idle")
    for frame in r.data["frames"]:
        for dev in frame["devices"]:
            del dev[call_key("nvmlDeviceGetTemperature", [0])]
            dev[call_key("nvmlDeviceGetPowerUsage", [])] = {"nvml_error": 15}  # GPU lost
    for _ in range(4):
        snaps = probe.snapshot()
    assert snaps[0].temperature_c is None and snaps[0].power_w is None
    assert snaps[0].utilization_pct == 0  # the rest still read
    msgs = [r.getMessage() for r in caplog.records]
    assert sum("nvmlDeviceGetTemperature is not supported" in m for m in msgs) == 1
    assert sum("nvmlDeviceGetPowerUsage failed" in m for m in msgs) == 1


def test_pre_535_driver_reasons_fallback():
    probe, r = replay("h100_hw_thermal")
    new, old = (call_key(n, []) for n in ("nvmlDeviceGetCurrentClocksEventReasons",
                                          "nvmlDeviceGetCurrentClocksThrottleReasons"))
    for frame in r.data["frames"]:
        for dev in frame["devices"]:
            dev[old] = dev.pop(new)
    r.set_frame(4)
    assert probe.snapshot()[6].reasons == ("hw_slowdown", "hw_thermal_slowdown")


def test_xid_events_are_reported_once(tmp_path):
    data = json.loads((FIX / "h100_idle.json").read_text())
    data["frames"][1]["xids"] = [{"device": 1, "xid": 79}]
    path = tmp_path / "xid.json"
    path.write_text(json.dumps(data))
    r = ReplayNvml(path)
    probe = NvmlProbe(r)
    r.set_frame(1)
    assert [s.xids for s in probe.snapshot()] == [(), (79,)]
    assert [s.xids for s in probe.snapshot()] == [(), ()]


def test_replay_follows_the_clock():
    now = [100.0]
    r = ReplayNvml(FIX / "h100_hw_thermal.json", clock=lambda: now[0])
    probe = NvmlProbe(r)
    assert probe.snapshot()[6].sm_clock_mhz == 1980  # t=0: not yet hot
    now[0] += 5.2
    assert probe.snapshot()[6].sm_clock_mhz == 1155


class _CtypesHandleNvml:
    """A pynvml stand-in whose handles are ctypes pointers, as the real binding's are."""

    def __init__(self, inner: ReplayNvml):
        self.inner, self.NVMLError = inner, inner.NVMLError

    def nvmlDeviceGetHandleByIndex(self, i):
        return ctypes.c_void_p(0x1000 + self.inner.nvmlDeviceGetHandleByIndex(i).index)

    def nvmlEventSetWait_v2(self, es, timeout):
        return self.inner.nvmlEventSetWait_v2(es, timeout)

    def __getattr__(self, name):
        fn = getattr(self.inner, name)
        if not name.startswith("nvmlDevice"):
            return fn
        return lambda *a: fn(*(ReplayHandle(x.value - 0x1000)
                               if isinstance(x, ctypes.c_void_p) else x for x in a))


def test_recording_replays_to_the_same_snapshots(tmp_path):
    source = ReplayNvml(FIX / "h100_hw_thermal.json")
    rec = RecordingNvml(_CtypesHandleNvml(source))
    live = NvmlProbe(rec, source="live")
    live.devices()
    recorded = []
    for k in (0, 6):
        source.set_frame(k)
        rec.new_frame(float(k))
        recorded.append(live.snapshot())
    assert len(recorded[1]) == 8 and recorded[1][6].sm_clock_mhz == 1155
    path = tmp_path / "rec.json"
    path.write_text(json.dumps(rec.fixture(note="test", meta={})))
    again = ReplayNvml(path)
    probe = NvmlProbe(again)
    for k, snaps in enumerate(recorded):
        again.set_frame(k)
        replayed = probe.snapshot()
        assert [s.to_json() | {"t": 0, "source": ""} for s in replayed] == \
            [s.to_json() | {"t": 0, "source": ""} for s in snaps]
    assert json.loads(path.read_text())["devices"][6]["uuid"].startswith("GPU-5a3c0006")


# -- GPU <-> rank -------------------------------------------------------------------------
@pytest.fixture(scope="module")
def devices():
    probe, _ = replay("h100_hw_thermal")
    return probe.devices()


@pytest.mark.parametrize("cvd, local_rank, want", [
    (None, 3, 3),  # unset: every GPU, device = local rank
    ("4,5,6,7", 2, 6),  # a subset: CUDA device 2 is NVML GPU 6
    ("6", 6, 6),  # one GPU per rank: the rank's device 0
    (" 7 , 3", 1, 3),  # spaces are fine
    ("GPU-5a3c0006", 0, 6),  # a unique UUID prefix
    ("GPU-5a3c0006-1d2e-4f60-8a9b-0c1d2e3f4a06,GPU-5a3c0001", 1, 1),
    ("GPU-5a3c000", 0, None),  # ambiguous prefix: no GPU
    ("5,4,-1,3", 1, 4),
    ("5,4,-1,3", 2, None),  # CUDA stops reading at the first invalid entry
    ("", 0, None),  # no GPU visible
    ("0,1", 5, None),  # local rank beyond the visible GPUs
    ("MIG-GPU-abc/1/0", 0, None),  # MIG instances are not mapped
])
def test_rank_to_gpu_honours_cuda_visible_devices(devices, cvd, local_rank, want):
    gpu = resolve_gpu(devices, local_rank=local_rank, cuda_visible_devices=cvd)
    assert (gpu.index if gpu else None) == want


def test_uuid_or_pci_bus_id_wins(devices):
    assert resolve_gpu(devices, local_rank=0, uuid=devices[5].uuid).index == 5
    assert resolve_gpu(devices, local_rank=0, pci_bus_id="0000:78:00.0").index == 6
    assert parse_visible_devices("1,x,2") == ["1"]


def test_rank_gpus_from_rank_metadata(devices):
    meta = {r: {"local_rank": r, "cuda_visible_devices": None} for r in range(8)}
    meta[9] = {"local_rank": 1, "cuda_visible_devices": "GPU-5a3c0004"}
    got = rank_gpus(devices, meta)
    assert {r: g.index for r, g in got.items()} == {**{r: r for r in range(8)}, 9: 4}
