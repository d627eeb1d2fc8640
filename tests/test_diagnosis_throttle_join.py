"""The engine joins a throttled GPU to the straggler it makes: one finding, both figures.

NVML readings here are CONSTRUCTED from NVML's documented values (tests/fixtures/nvml, no
GPU on this machine), replayed through the live probe's code; the finding says so."""

from __future__ import annotations

from eventstreams import _steps
from test_probes_sampler_throttle import replayed_run

from distdoctor.diagnosis.engine.core import Engine
from distdoctor.diagnosis.live import gpu_findings_fn


def test_throttled_gpu_joins_the_straggler_it_serves(tmp_path):
    engine = Engine(60)
    engine.gpu_findings = gpu_findings_fn()
    engine.samples.extend(replayed_run(tmp_path, "h100_hw_thermal"))
    engine.ingest(_steps(8, 20, late_rank=6, late_ms=38), 0.0)
    engine.tick(None, final=True)
    findings = engine.findings()
    assert [(f.kind, f.ranks) for f in findings] == [("straggler", [6])], findings
    summary = findings[0].summary
    assert "rank 6 is the straggler" in summary
    assert "HW thermal slowdown at 89 C, SM clock 1155/1980 MHz" in summary
    assert "replayed NVML readings" in summary  # never shown as live


def test_a_throttled_gpu_alone_is_a_throttle_finding(tmp_path):
    engine = Engine(60)
    engine.gpu_findings = gpu_findings_fn()
    engine.samples.extend(replayed_run(tmp_path, "h100_hw_thermal"))
    engine.ingest(_steps(8, 20), 0.0)
    engine.tick(None, final=True)
    assert [(f.kind, f.ranks) for f in engine.findings()] == [("throttle", [6])]
