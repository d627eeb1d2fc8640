"""NVML readings recorded on a real GPU (tests/fixtures/nvml_recorded/, written by
test_nvml_live.py through the GPU suite) replayed through the live probe code on CPU.

Not a GPU test: it runs everywhere, on every recording committed. Until the first GPU
machine has recorded some, it is skipped and says so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from distdoctor.probes.gpu_map import resolve_gpu
from distdoctor.probes.nvml import NvmlProbe
from distdoctor.probes.nvml_replay import ReplayNvml

RECORDED = Path(__file__).parents[1] / "fixtures" / "nvml_recorded"
FILES = sorted(RECORDED.glob("*.json")) if RECORDED.is_dir() else []


@pytest.mark.parametrize("path", FILES or [pytest.param(None, marks=pytest.mark.skip(
    reason=f"no recorded NVML fixture in {RECORDED.relative_to(Path(__file__).parents[2])} "
           "yet: run benchmarks/gpu_suite.py --stage tests on a GPU machine and commit the "
           "nvml_*.json it writes"))], ids=lambda p: p.name if p else "none")
def test_a_recording_replays_through_the_probe_as_replayed_physical_readings(path):
    data = json.loads(path.read_text())
    assert data["constructed"] is False and "RECORDED" in data["note"]
    assert data["meta"]["driver"] and data["meta"]["gpu"]
    replay = ReplayNvml(path)
    probe = NvmlProbe(replay)
    devices = probe.devices()
    assert devices and resolve_gpu(devices, local_rank=0) is not None
    busy = []
    for k in range(replay.frame_count):
        replay.set_frame(k)
        for s in probe.snapshot():
            assert not s.live and s.source == f"replay:{path.name}"
            assert s.name == data["meta"]["gpu"] or s.index > 0
            assert 5 <= s.temperature_c <= 110
            assert 0 < s.sm_clock_mhz <= s.max_sm_clock_mhz
            assert 0 < s.memory_used_bytes <= s.memory_total_bytes
            if s.index == 0:
                busy.append(s.utilization_pct)
    if data["meta"]["scenario"] == "matmul":
        assert max(busy) >= 50, busy
    else:
        assert min(busy) <= 10, busy
