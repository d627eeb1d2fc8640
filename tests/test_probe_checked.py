"""Probe samples are read with each reading of its declared type (probes/checked.py).

A real sample (this machine's host and process readings, and a GPU's readings from NVML's
documented values: nvml.h's clock-event reason bits, an H100's 1980 MHz boost clock,
labelled as such in its source) is written as the sampler writes it; then each reading,
in turn, is made each odd value a file could hold. The line is read back either as no
sample (a required reading: time, host, a process's rank) or as a sample whose every
reading is of its type, the others as they were.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import MISSING, fields

import pytest
from distdoctor.probes.checked import checked_fields
from distdoctor.probes.host import HostProbe, HostSnapshot, ProcessSnapshot
from distdoctor.probes.nvml_values import GpuSnapshot
from distdoctor.probes.sampler import NodeSample, _parse_line

ODD = [[1], {"a": 1}, "text", 10**30, -(10**30), True, None, 1e308, "x" * 5000, [None]]


def _real_line() -> dict:
    probe = HostProbe()
    host = probe.host_snapshot(job_pids=[os.getpid()])
    proc = probe.process_snapshot(0, os.getpid())
    gpu = GpuSnapshot(t=time.time(), source="replay:nvml-documented-values", index=0,
                      uuid="GPU-documented", name="NVIDIA H100 80GB HBM3",
                      sm_clock_mhz=1980, max_sm_clock_mhz=1980, power_w=700.0,
                      reasons_mask=0x20, reasons=("sw_thermal_slowdown",), xids=(79,),
                      violation_ns={"thermal": 10**9})
    return NodeSample(time.time(), host.host, "live", host, (proc,), (gpu,),
                      {0: "GPU-documented"}).to_json()


def _paths(d: dict):
    yield from ((k,) for k in d if k not in ("host_stats", "processes", "gpus"))
    yield from (("host_stats", k) for k in d["host_stats"])
    yield from (("processes", 0, k) for k in d["processes"][0])
    yield from (("gpus", 0, k) for k in d["gpus"][0])


def _typed(sample: NodeSample) -> None:
    """Every reading of the sample is of its declared type: checking it again keeps it."""
    parts = [(HostSnapshot, sample.host_stats)] if sample.host_stats else []
    parts += [(ProcessSnapshot, p) for p in sample.processes]
    parts += [(GpuSnapshot, g) for g in sample.gpus]
    for cls, snap in parts:
        again = cls(**checked_fields(cls, snap.to_json()))
        assert again == snap, (cls.__name__, snap)
    assert isinstance(sample.t, float) and math.isfinite(sample.t)
    assert isinstance(sample.host, str) and isinstance(sample.nvml, str)
    assert all(isinstance(r, int) and isinstance(g, str)
               for r, g in sample.gpu_of_rank.items())


def test_the_real_line_reads_back_as_written():
    line = _real_line()
    sample = _parse_line(json.dumps(line), "node-x.jsonl")
    assert sample is not None and sample.to_json() == line


@pytest.mark.parametrize("value", ODD, ids=[repr(v)[:12] for v in ODD])
def test_each_reading_made_odd_costs_that_reading_only(value):
    line = _real_line()
    for path in _paths(line):
        d = json.loads(json.dumps(line))
        at = d
        for key in path[:-1]:
            at = at[key]
        at[path[-1]] = value
        try:
            text = json.dumps(d)
        except ValueError:
            continue
        sample = _parse_line(text, "node-x.jsonl")
        if sample is None:  # no sample: only for a required reading
            assert path in (("t",), ("host",), ("nvml",)), path
            continue
        _typed(sample)
        if len(path) == 1:
            continue
        # the entry the odd reading is in: its other readings as they were, or the entry
        # left out where the odd reading is one it requires (no default)
        cls = {"host_stats": HostSnapshot, "processes": ProcessSnapshot,
               "gpus": GpuSnapshot}[path[0]]
        entry = sample.host_stats if path[0] == "host_stats" else (
            getattr(sample, path[0])[0] if getattr(sample, path[0]) else None)
        required = {f.name for f in fields(cls) if f.default is MISSING
                    and f.default_factory is MISSING}
        if entry is None:
            assert path[-1] in required, path
            continue
        was = line["host_stats"] if path[0] == "host_stats" else line[path[0]][0]
        got = entry.to_json()
        assert {k: v for k, v in got.items() if k != path[-1]} == \
            {k: v for k, v in was.items() if k != path[-1]}, path


def test_a_reading_left_out_is_none_and_a_required_one_refuses_the_entry():
    entry = {"rank": 0, "pid": 1, "alive": True, "status": "running"}
    assert checked_fields(ProcessSnapshot, entry)["cpu_pct"] is None
    with pytest.raises(ValueError, match="ProcessSnapshot.pid"):
        checked_fields(ProcessSnapshot, dict(entry, pid=2**64))
