"""Steps as the user's framework counts them: a real 2-rank Lightning DDP job (with the
sanity check's validation batches, which used to inflate the count) where rank 0 alone
all-reduces at a step of Lightning's count. The finding gives Lightning's own
`global_step`, the number the job printed at the bug, and says whose count it is.

Lightning runs from a checkout on PYTHONPATH (a copy of the installed package), not from
beside the interpreter: whose code a frame is goes by package, so the other rank's site
is still the user's line (`trainer.fit`), not Lightning's `LightningModule.backward`."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest
from conftest import JOBS, marker_lines, own_sites, run_cli

pytestmark = pytest.mark.timeout(300)  # a hard stop over run_cli's own

JOB = "frameworks/lightning_steps.py"


def test_lightning_mismatch_is_reported_at_lightnings_global_step(tmp_path):
    lightning = pytest.importorskip("lightning")
    checkout = tmp_path / "checkout"
    shutil.copytree(Path(lightning.__file__).parent, checkout / "lightning")
    run_dir = tmp_path / "run"
    res = run_cli(["run", "--run-dir", str(run_dir), "--grace", "2", "--hang-timeout", "5",
                   "--on-hang", "kill", "--", sys.executable, "-m", "torch.distributed.run",
                   "--nproc-per-node", "2", str(JOBS / JOB)], timeout=180, run_dir=run_dir,
                  env={"PYTHONPATH": str(checkout)})
    assert f"lightning from {checkout / 'lightning'}" in res.stdout + res.stderr  # the copy ran
    printed = re.search(r"bug at global_step (\d+)", res.stdout + res.stderr)
    assert printed, res.stdout[-2000:] + res.stderr[-2000:]
    findings = json.loads((run_dir / "findings.json").read_text())["findings"]
    mismatch = [f for f in findings if f["kind"] == "mismatch" and f.get("seq") is not None]
    assert mismatch, findings
    f = mismatch[0]
    assert f["ranks"] == [0]
    assert f["details"]["span"] == f"global_step {printed.group(1)} (Lightning)", f["summary"]
    assert f"in global_step {printed.group(1)} (Lightning)" in f["summary"]
    sites = own_sites(f)
    assert sites[0]["line"] == marker_lines(JOB)["culprit"]
    assert sites[1]["file"] == str(JOBS / JOB) and sites[1]["line"] == marker_lines(JOB)["fit"]
    # Lightning's own frame, known by package where it runs from a checkout
    assert sites[1].get("framework", {}).get("name") == "Lightning", sites[1]
    assert sites[1].get("call") == "trainer.fit", sites[1]

    # what the launcher printed of the ranks' ends is the finding's word on them
    out = res.stdout + res.stderr
    for rank in re.findall(r"rank\s*:\s*(\d+) \(local_rank: \d+\)\s*\n\s*exitcode\s*:"
                           r"\s*-6 \(pid", out):
        crash = [x for x in findings if x["kind"] == "crash" and x["ranks"] == [int(rank)]]
        assert crash and "killed by SIGABRT" in crash[0]["summary"], crash
    # gloo's size error, read from the job's output, is said live once
    assert out.count("distdoctor: MISMATCH Gloo received") <= 1, out[-3000:]


def test_hf_trainer_mismatch_is_reported_at_the_trainers_global_step(tmp_path):
    """HF Trainer with gradient accumulation: a rank-0-only callback collective at the
    Trainer's global_step (pip install -e .[frameworks] for transformers)."""
    pytest.importorskip("transformers")
    job = "frameworks/hf_trainer_steps.py"
    run_dir = tmp_path / "run"
    res = run_cli(["run", "--run-dir", str(run_dir), "--grace", "2", "--hang-timeout", "5",
                   "--on-hang", "kill", "--", sys.executable, "-m", "torch.distributed.run",
                   "--nproc-per-node", "2", str(JOBS / job)], timeout=180, run_dir=run_dir)
    printed = re.search(r"bug at global_step (\d+)", res.stdout + res.stderr)
    assert printed, res.stdout[-2000:] + res.stderr[-2000:]
    findings = json.loads((run_dir / "findings.json").read_text())["findings"]
    mismatch = [f for f in findings if f["kind"] == "mismatch" and f["ranks"] == [0]]
    assert mismatch, findings
    assert mismatch[0]["details"]["span"] == f"global_step {printed.group(1)} (HF Trainer)"
    sites = own_sites(mismatch[0])
    lines = marker_lines(job)
    assert sites[0]["line"] == lines["culprit"] and sites[1]["line"] == lines["fit"], sites


def test_accelerate_mismatch_is_reported_at_the_optimizer_steps_taken(tmp_path):
    """Accelerate keeps no count of optimizer steps: the step is the optimizer's (its
    accumulation steps are not steps), the count the job keeps as Accelerate's examples do;
    each side is named at the user's line, not in accelerate's own code."""
    pytest.importorskip("accelerate")
    job = "frameworks/accelerate_steps.py"
    run_dir = tmp_path / "run"
    res = run_cli(["run", "--run-dir", str(run_dir), "--grace", "2", "--hang-timeout", "5",
                   "--on-hang", "kill", "--", sys.executable, "-m", "torch.distributed.run",
                   "--nproc-per-node", "2", str(JOBS / job)], timeout=180, run_dir=run_dir)
    printed = re.search(r"bug after (\d+) optimizer steps", res.stdout + res.stderr)
    assert printed, res.stdout[-2000:] + res.stderr[-2000:]
    findings = json.loads((run_dir / "findings.json").read_text())["findings"]
    mismatch = [f for f in findings if f["kind"] == "mismatch" and f["ranks"] == [0]]
    assert mismatch, findings
    assert mismatch[0]["details"]["span"] == f"step {printed.group(1)}"
    sites = own_sites(mismatch[0])
    assert sites[0]["file"] == sites[1]["file"] == str(JOBS / job), sites
    assert sites[0]["line"] == marker_lines(job)["culprit"]


def test_two_optimizers_stepping_once_each_are_one_step(tmp_path):
    """A GAN's loop: the critic's and the generator's optimizers step once per
    iteration. The step is the iteration the job printed, not the sum of both
    optimizers' steps (twice as many)."""
    job = "frameworks/two_optimizers.py"
    run_dir = tmp_path / "run"
    res = run_cli(["run", "--nproc", "2", "--run-dir", str(run_dir), "--grace", "2",
                   "--on-hang", "kill", "--", str(JOBS / job)], timeout=150, run_dir=run_dir)
    printed = re.search(r"bug at iteration (\d+) after (\d+) critic steps",
                        res.stdout + res.stderr)
    assert printed and printed.group(1) == printed.group(2), res.stdout[-2000:]
    findings = json.loads((run_dir / "findings.json").read_text())["findings"]
    mismatch = [f for f in findings if f["kind"] == "mismatch" and f["ranks"] == [1]]
    assert mismatch, findings
    assert mismatch[0]["details"]["span"] == f"step {printed.group(1)}", mismatch[0]["summary"]
    assert own_sites(mismatch[0])[1]["line"] == marker_lines(job)["culprit"]
