"""The node sampler (into the run dir, bounded, read back) and the throttle detector, with its
join to the straggler finding.

GPU readings come from the CONSTRUCTED fixtures in tests/fixtures/nvml/ (built from NVML's
documented values, not recorded; see make_constructed.py), replayed through the live probe code.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from distdoctor.probes.nvml import NvmlProbe
from distdoctor.probes.nvml_replay import ReplayNvml
from distdoctor.probes.sampler import Sampler, read_samples, samples_path

from distdoctor.diagnosis.stragglers.throttle import join_with_straggler, throttle_findings
from distdoctor.errors import UserError
from distdoctor.findings import Finding

FIX = Path(__file__).parent / "fixtures" / "nvml"
EIGHT = {r: {"local_rank": r, "cuda_visible_devices": None} for r in range(8)}


def replayed_run(run_dir: Path, fixture: str, frames: int | None = None) -> list:
    """Tick a sampler over every frame of a fixture, one second apart (a fake clock)."""
    replay = ReplayNvml(FIX / f"{fixture}.json")
    now = [1_000_000.0]
    sampler = Sampler(run_dir, lambda: {0: os.getpid()},
                      nvml=NvmlProbe(replay, clock=lambda: now[0]),
                      rank_info=lambda: EIGHT, clock=lambda: now[0])
    for k in range(frames or replay.frame_count):
        replay.set_frame(k)
        now[0] = 1_000_000.0 + k
        sampler.tick()
    sampler.stop()
    return read_samples(run_dir)


def test_sampler_writes_host_processes_and_gpus(tmp_path):
    samples = replayed_run(tmp_path, "h100_hw_thermal")
    assert len(samples) == 12
    s = samples[-1]
    assert s.nvml == "replay:h100_hw_thermal.json"  # never presented as live
    assert all(g.source == "replay:h100_hw_thermal.json" for g in s.gpus)
    assert s.processes[0].pid == os.getpid() and s.processes[0].alive
    assert s.host_stats.mem_total_bytes > 0
    assert s.gpu_of_rank[6] == s.gpus[6].uuid
    assert s.gpus[6].sm_clock_mhz == 1155
    lines = samples_path(tmp_path).read_text().splitlines()
    assert json.loads(lines[0])["format"] == "distdoctor-probes"


def test_sampler_without_nvml_still_samples_host(tmp_path):
    sampler = Sampler(tmp_path, lambda: {0: os.getpid()}, interval_s=0.05).start()
    try:
        deadline = time.monotonic() + 10
        while len(read_samples(tmp_path)) < 3:
            assert time.monotonic() < deadline, "sampler wrote nothing"
            time.sleep(0.05)
    finally:
        sampler.stop()
    s = read_samples(tmp_path)[-1]
    assert s.gpus == () and s.nvml.startswith("no NVIDIA driver")
    assert s.processes[0].alive and s.host_stats.cpu_count >= 1
    assert sampler.latest() is not None and sampler._thread is None


def test_sampler_maps_ranks_from_the_run_dir_metadata(tmp_path):
    (tmp_path / "ranks").mkdir()
    import socket

    for r in (0, 1):
        (tmp_path / "ranks" / f"rank-{r:05d}.json").write_text(json.dumps(
            {"rank": r, "host": socket.gethostname(), "local_rank": r,
             "cuda_visible_devices": "6,7"}))
    replay = ReplayNvml(FIX / "h100_hw_thermal.json")
    s = Sampler(tmp_path, lambda: {0: os.getpid()}, nvml=NvmlProbe(replay)).tick()
    assert dict(s.gpu_of_rank) == {0: s.gpus[6].uuid, 1: s.gpus[7].uuid}


def test_samples_are_bounded_and_read_across_rotation(tmp_path):
    replay = ReplayNvml(FIX / "h100_idle.json")
    sampler = Sampler(tmp_path, dict, nvml=NvmlProbe(replay), max_bytes=8_000)
    for _ in range(40):
        sampler.tick()
    sampler.stop()
    path = samples_path(tmp_path)
    old = path.with_name(path.name + ".1")
    assert old.exists() and path.stat().st_size <= 8_000 and old.stat().st_size <= 8_000
    samples = read_samples(tmp_path)
    assert 2 <= len(samples) < 40
    assert [s.t for s in samples] == sorted(s.t for s in samples)


def test_reader_skips_a_torn_line_and_rejects_a_newer_version(tmp_path):
    sampler = Sampler(tmp_path, dict, nvml=NvmlProbe(ReplayNvml(FIX / "h100_idle.json")))
    sampler.tick()
    sampler.tick()
    sampler.stop()
    path = samples_path(tmp_path)
    with open(path, "a") as f:
        f.write('{"t": 12, "host": "x", "gp')
    assert len(read_samples(tmp_path)) == 2
    path.write_text(json.dumps({"format": "distdoctor-probes", "version": 99}) + "\n")
    with pytest.raises(UserError, match="newer"):
        read_samples(tmp_path)


# -- the throttle detector --------------------------------------------------------------
def test_hw_thermal_slowdown_names_the_rank(tmp_path):
    found = throttle_findings(replayed_run(tmp_path, "h100_hw_thermal"))
    assert len(found) == 1
    f = found[0]
    assert (f.kind, f.ranks) == ("throttle", [6])
    d = f.details
    assert (d["temperature_c"], d["sm_clock_mhz"], d["max_sm_clock_mhz"]) == (89, 1155, 1980)
    assert d["headline_reasons"] == ["hw_thermal_slowdown"]
    assert set(d["reasons"]) == {"hw_slowdown", "hw_thermal_slowdown"}
    assert d["duration_s"] == 10.0 and d["violation_s"]["thermal"] == 9.0
    assert "HW thermal slowdown at 89 C, SM clock 1155/1980 MHz" in f.summary
    assert "rank 6's GPU 6" in f.summary
    assert "replayed NVML readings: h100_hw_thermal.json" in f.summary  # not shown as live
    assert "cooling" in f.remedy
    assert Finding.from_json(json.loads(json.dumps(f.to_json()))).to_json() == f.to_json()


def test_sw_power_cap_is_reported(tmp_path):
    found = throttle_findings(replayed_run(tmp_path, "h100_sw_power_cap"))
    assert [(f.ranks, f.details["headline_reasons"]) for f in found] == [([1], ["sw_power_cap"])]
    assert "power limit (700.0 W)" in found[0].remedy


@pytest.mark.parametrize("fixture", ["h100_idle", "h100_matmul"])
def test_no_finding_for_idle_or_healthy_load(tmp_path, fixture):
    assert throttle_findings(replayed_run(tmp_path, fixture)) == []


def test_short_blip_is_not_a_finding(tmp_path):
    samples = replayed_run(tmp_path, "h100_hw_thermal", frames=4)  # hot for 2 readings
    assert throttle_findings(samples) == []
    assert len(throttle_findings(samples, min_duration_s=2)) == 1


def test_explicit_rank_mapping_and_json_samples(tmp_path):
    samples = replayed_run(tmp_path, "h100_hw_thermal")
    uuid6 = samples[0].gpus[6].uuid
    found = throttle_findings([s.to_json() for s in samples], rank_of_gpu={uuid6: 14})
    assert found[0].ranks == [14]


def straggler(rank: int, lateness_ms: float) -> Finding:
    return Finding("straggler", "warning", f"straggler: rank {rank} ...", [rank], "default_pg",
                   None, [{"rank": rank, "file": "/abs/train.py", "line": 88,
                           "function": "step"}],
                   details={"lateness_ms": lateness_ms, "step_lateness_ms": 152.0})


def test_join_throttled_straggler_into_one_finding(tmp_path):
    thr = throttle_findings(replayed_run(tmp_path, "h100_hw_thermal"))
    out = join_with_straggler(thr, [straggler(6, 38.2), straggler(2, 4.1)])
    assert [f.kind for f in out] == ["straggler", "straggler"]
    joined, other = out
    assert joined.summary.startswith(
        "rank 6 is the straggler (+38 ms per collective); its GPU reports HW thermal "
        "slowdown at 89 C, SM clock 1155/1980 MHz")
    assert joined.ranks == [6] and joined.callsites[0]["line"] == 88
    assert joined.details["lateness_ms"] == 38.2
    assert joined.details["throttle"]["temperature_c"] == 89
    assert other.ranks == [2] and "throttle" not in other.details


def test_join_keeps_unrelated_findings(tmp_path):
    thr = throttle_findings(replayed_run(tmp_path, "h100_hw_thermal"))
    out = join_with_straggler(thr, [straggler(3, 12.0)])
    assert [(f.kind, f.ranks) for f in out] == [("straggler", [3]), ("throttle", [6])]
    assert join_with_straggler([], []) == []
