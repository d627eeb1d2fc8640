"""The reference trainer on GPUs (NCCL), bare and under `distdoctor run`: the same
per-step losses, digit for digit, and the step's loss all-reduce recorded on the GPU.

Tracing must leave results bit-identical (DESIGN: never harm the job). Both runs use the
same seed and CUBLAS_WORKSPACE_CONFIG, so that cuBLAS picks the same reduction order."""

from __future__ import annotations

import json
import sys

import pytest
from conftest import run_cli
from distdoctor.reference_trainer.launch import launch
from distdoctor.reference_trainer.train import parse_step_log

from distdoctor.runlog.run import read_run
from gpu.gpu_support import note_measurement

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(400)]

STEPS = 20
ARGS = ["--device", "cuda", "--steps", str(STEPS), "--log-every", "1", "--timeout-s", "120"]
SAME_CUBLAS = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}


@pytest.mark.parametrize("world, degrees", [
    pytest.param(1, [], id="world1"),
    pytest.param(2, ["--dp", "2"], id="world2-ddp", marks=pytest.mark.gpu(2)),
])
def test_traced_gpu_run_logs_the_same_losses_as_the_bare_run(world, degrees, tmp_path):
    args = [*ARGS, *degrees]
    bare = launch(world, args, timeout_s=240, env=SAME_CUBLAS)
    assert bare.ok, bare.tail()
    run_dir = tmp_path / "run"
    proc = run_cli(["run", "--nproc", str(world), "--run-dir", str(run_dir), "--grace", "2",
                    "--", sys.executable, "-m", "distdoctor.reference_trainer", *args],
                   timeout=240, env=SAME_CUBLAS, run_dir=run_dir)
    assert proc.returncode == 0, proc.stderr[-3000:]
    want = [s["loss"] for s in bare.steps()]
    got = [s["loss"] for s in parse_step_log(proc.stdout)]
    assert len(want) == STEPS and want[-1] < want[0], bare.tail()  # it learns
    assert got == want, f"traced {got}\nbare   {want}"

    run = read_run(run_dir)
    loss_reduces = [e for e in run.events[0] if e.op == "all_reduce" and e.callsite
                    and e.callsite["function"] == "reduce_loss_for_logging"]
    assert len(loss_reduces) == STEPS, [(e.op, e.callsite) for e in run.events[0]][:20]
    assert all(e.device.startswith("cuda") and e.status == "ok" for e in loss_reduces)
    findings = json.loads((run_dir / "findings.json").read_text())["findings"]
    assert not [f for f in findings if f["severity"] == "error"], findings
    bare_ms = sorted(s["ms"] for s in bare.steps()[2:])
    traced_ms = sorted(s["ms"] for s in parse_step_log(proc.stdout)[2:])
    note_measurement("trainer_gpu", world=world, steps=STEPS,
                     bare_median_step_ms=bare_ms[len(bare_ms) // 2],
                     traced_median_step_ms=traced_ms[len(traced_ms) // 2])
