"""The NVML probe on a real GPU: it finds the GPU torch uses, reads physical values, and
what it reads is recorded as a replay fixture that replays to the very same snapshots.

The recordings (idle, and under a bf16 matmul load) are written where the GPU suite says
(DISTDOCTOR_GPU_FIXTURES, its out folder): commit them under tests/fixtures/nvml_recorded/
and tests/gpu/test_nvml_recorded_replay.py replays them on every CPU run."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest
from distdoctor.probes.gpu_map import resolve_gpu
from distdoctor.probes.nvml import NvmlProbe, load_pynvml
from distdoctor.probes.nvml_replay import RecordingNvml, ReplayNvml

from gpu.gpu_support import fixtures_dir, note_measurement, slug

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(240)]

FRAMES, INTERVAL_S = 12, 0.5
LOAD = textwrap.dedent("""
    import sys, time, torch
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = a @ a
    torch.cuda.synchronize()
    print("LOADED", flush=True)
    end = time.monotonic() + float(sys.argv[1])
    while time.monotonic() < end:
        for _ in range(20):
            b = a @ a
        torch.cuda.synchronize()
""")
SCENARIOS = {"idle": "nothing running on the GPU",
             "matmul": "a bf16 8192x8192 matmul loop on GPU 0 (another process)"}


def test_the_probe_reads_the_gpu_torch_uses():
    import torch

    probe = NvmlProbe()
    devices = probe.devices()
    assert probe.available and devices, probe.unavailable_reason
    gpu = resolve_gpu(devices, local_rank=0,
                      cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"))
    assert gpu is not None, devices
    props = torch.cuda.get_device_properties(0)
    if hasattr(props, "uuid"):  # torch's UUID has no "GPU-" prefix

        def bare(uuid) -> str:
            return str(uuid).lower().removeprefix("gpu-").replace("-", "")

        assert bare(gpu.uuid) == bare(props.uuid), (gpu, props.uuid)
    snap = probe.snapshot([gpu.index])[0]
    probe.close()
    assert snap.live and snap.source == "live"
    assert snap.name == props.name, (snap.name, props.name)
    assert abs(snap.memory_total_bytes - props.total_memory) <= 0.02 * props.total_memory
    assert 5 <= snap.temperature_c <= 110, snap
    assert snap.max_sm_clock_mhz and 0 < snap.sm_clock_mhz <= snap.max_sm_clock_mhz, snap
    assert snap.power_w is None or 0 < snap.power_w <= 1.2 * (snap.power_limit_w or 2000)
    note_measurement("nvml_live", gpu=snap.name, temperature_c=snap.temperature_c,
                     sm_clock_mhz=snap.sm_clock_mhz, max_sm_clock_mhz=snap.max_sm_clock_mhz,
                     power_w=snap.power_w, power_limit_w=snap.power_limit_w,
                     reasons=list(snap.reasons))


def _start_load(seconds: float) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", LOAD, str(seconds)], stdout=subprocess.PIPE,
                            text=True, stdin=subprocess.DEVNULL, start_new_session=True)
    line = proc.stdout.readline()  # blocks until warmed up (or the process died)
    assert line.strip() == "LOADED", f"the matmul load did not start (exit {proc.poll()})"
    return proc


def _record(scenario: str) -> tuple[RecordingNvml, list, str]:
    """FRAMES readings of every GPU through the live probe, each NVML answer written down."""
    rec = RecordingNvml(load_pynvml())
    probe = NvmlProbe(rec, source="live")
    assert probe.devices(), probe.unavailable_reason
    driver = probe.call("nvmlSystemGetDriverVersion")
    live, t0 = [], time.monotonic()
    for _ in range(FRAMES):
        rec.new_frame(time.monotonic() - t0)
        live.append(probe.snapshot())
        time.sleep(INTERVAL_S)
    probe.close()
    return rec, live, driver if isinstance(driver, str) else str(driver)


def _normal(snaps) -> list[dict]:
    return [s.to_json() | {"t": 0, "source": ""} for s in snaps]


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_real_readings_are_recorded_and_replay_to_the_same_snapshots(scenario, tmp_path):
    load = _start_load(FRAMES * INTERVAL_S + 30) if scenario == "matmul" else None
    try:
        rec, live, driver = _record(scenario)
    finally:
        if load is not None:
            load.terminate()
            load.wait(30)
    busy = [s[0].utilization_pct for s in live if s[0].utilization_pct is not None]
    assert busy, "NVML gave no utilization"
    if scenario == "matmul":
        assert max(busy) >= 50, busy
    else:
        assert min(busy) <= 10, busy
    gpu = live[0][0].name or "gpu"
    name = f"nvml_{slug(gpu)}_{scenario}.json"
    path = fixtures_dir(tmp_path) / name
    meta = {"host": socket.gethostname(), "driver": driver, "gpu": gpu,
            "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "scenario": scenario,
            "seconds": round(FRAMES * INTERVAL_S, 1), "interval_s": INTERVAL_S}
    note = (f"RECORDED on a real {gpu} (driver {driver}) by tests/gpu/test_nvml_live.py: "
            f"{SCENARIOS[scenario]}")
    path.write_text(json.dumps(rec.fixture(note=note, meta=meta), indent=1) + "\n")

    replay = ReplayNvml(path)
    probe = NvmlProbe(replay)
    for k, snaps in enumerate(live):
        replay.set_frame(k)
        again = probe.snapshot()
        assert all(not s.live and s.source == f"replay:{name}" for s in again)
        assert _normal(again) == _normal(snaps), f"frame {k}"
    note_measurement("nvml_recording", scenario=scenario, file=name, frames=len(live),
                     utilization_pct=[min(busy), max(busy)],
                     sm_clock_mhz=sorted({s[0].sm_clock_mhz for s in live}))
