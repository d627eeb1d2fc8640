"""A hang on the GPU while the host runs on: a kernel spins on device memory, the next
all_reduce queues behind it, the host goes on. The tracer keeps that op in flight
(its CUDA end event never fires), and `distdoctor run` reports a hang at that op, its
sequence number and its line, then stops the job (--on-hang kill).

Under the fixed rule (--hang-timeout 5) the hang is named after 5 s. Under the default
progress rule every rank has joined the op and none completes, so it is named once the
wait passes the all-joined floor (30 s, diagnosis/hangs/progress.py)."""

from __future__ import annotations

import json

import pytest
from conftest import run_cli

from distdoctor.runlog.run import read_run
from gpu.gpu_support import JOBS, marker_lines, note_measurement

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(300)]

JOB = "cuda_hang.py"


@pytest.mark.parametrize("world, policy", [
    pytest.param(1, "5", id="world1-fixed5s"),
    pytest.param(1, "auto", id="world1-auto"),
    pytest.param(2, "5", id="world2-fixed5s", marks=pytest.mark.gpu(2)),
])
def test_a_kernel_spinning_on_device_memory_is_a_hang_at_the_queued_op(world, policy,
                                                                         tmp_path):
    run_dir = tmp_path / "run"
    proc = run_cli(["run", "--nproc", str(world), "--run-dir", str(run_dir), "--grace", "2",
                    "--hang-timeout", policy, "--on-hang", "kill", "--", str(JOBS / JOB)],
                   timeout=200, run_dir=run_dir)
    assert proc.stdout.count("HOST_GOES_ON") == world, proc.stdout[-2000:]  # host went on
    assert "nobody stopped the job" not in proc.stdout, proc.stderr[-3000:]
    assert proc.returncode != 0
    findings = json.loads((run_dir / "findings.json").read_text())["findings"]
    hangs = [f for f in findings if f["kind"] == "hang" and f["severity"] == "error"]
    described = "\n".join(f"{f['kind']} {f['severity']} {f['summary']}" for f in findings)
    assert hangs, described

    line = marker_lines(JOB)["stuck"]
    run = read_run(run_dir)
    for rank, events in run.events.items():
        mine = [e for e in events if e.callsite and e.callsite["file"].endswith(JOB)]
        healthy = [e for e in mine if e.callsite["line"] == marker_lines(JOB)["healthy"]]
        stuck = [e for e in mine if e.callsite["line"] == line]
        assert len(healthy) == 3 and all(e.status == "ok" for e in healthy), (rank, healthy)
        assert len(stuck) == 1 and stuck[0].t_end_ns is None, (rank, stuck)
    stuck = [e for e in run.events[0] if e.callsite and e.callsite["line"] == line][0]
    f = hangs[0]
    assert (f["group"], f["seq"]) == (stuck.group, stuck.seq), (f, stuck)
    assert line in {c["line"] for c in f["callsites"]}, f["callsites"]
    note_measurement("cuda_hang", world=world, policy=policy,
                     waited_s=f["details"].get("waited_s"), summary=f["summary"])
