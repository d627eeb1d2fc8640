"""The framework's frame beside the user's line: a real 2-rank Lightning DDP job whose
callback saves a checkpoint on rank 0 only (ray-project/ray#56997). Each side of the
finding names the user's line and the innermost framework frame that issued its op
(Lightning's `DDPStrategy.barrier`, from `trainer.save_checkpoint`), so the other rank's
line is more than `trainer.fit(...)`."""

from __future__ import annotations

import json
import sys

import pytest
from conftest import JOBS, marker_lines, own_sites, run_cli

pytestmark = pytest.mark.timeout(240)  # a hard stop over run_cli's own

JOB = "frameworks/lightning_rank0_checkpoint.py"


def test_each_side_names_the_framework_frame_that_issued_its_op(tmp_path):
    pytest.importorskip("lightning")
    run_dir = tmp_path / "run"
    run_cli(["run", "--run-dir", str(run_dir), "--grace", "2", "--hang-timeout", "5",
             "--on-hang", "kill", "--", sys.executable, "-m", "torch.distributed.run",
             "--nproc-per-node", "2", str(JOBS / JOB)], timeout=180, run_dir=run_dir)
    findings = json.loads((run_dir / "findings.json").read_text())["findings"]
    mismatch = [f for f in findings if f["kind"] == "mismatch" and f["severity"] == "error"]
    assert mismatch, findings
    f = mismatch[0]
    assert f["ranks"] == [0], f["summary"]
    lines = marker_lines(JOB)
    sites = own_sites(f)
    ours = sites[0]
    assert ours["line"] == lines["culprit"], ours
    assert ours["framework"]["name"] == "Lightning", ours
    assert ours["framework"]["function"].endswith("Strategy.barrier"), ours
    assert ours["call"] == "trainer.save_checkpoint", ours
    theirs = sites[1]
    assert theirs["line"] == lines["fit"] and theirs["call"] == "trainer.fit", theirs
    assert theirs["framework"]["name"] == "Lightning", theirs
    assert theirs["framework"]["file"] != ours["framework"]["file"] or (
        theirs["framework"]["line"] != ours["framework"]["line"]), sites
    # the summary says both sides the same way
    assert (f"in Lightning's {ours['framework']['function']}, from trainer.save_checkpoint "
            f"at lightning_rank0_checkpoint.py:{lines['culprit']}") in f["summary"]
    assert (f"in Lightning's {theirs['framework']['function']}, from trainer.fit at "
            f"lightning_rank0_checkpoint.py:{lines['fit']}") in f["summary"]


def test_whose_frame_is_a_frameworks_goes_by_package_and_role():
    """torch counts where it issues collectives for the user (DDP, FSDP, DCP), not where
    it is the API the user called; a framework counts wherever it is installed."""
    import os

    import torch

    from distdoctor.tracer.callsite import framework_of
    torch_dir = os.path.dirname(torch.__file__)
    assert framework_of(os.path.join(torch_dir, "nn", "parallel", "distributed.py")) == "torch"
    assert framework_of(os.path.join(torch_dir, "distributed", "fsdp", "_fully_shard",
                                     "_fsdp_collectives.py")) == "torch"
    for api in ("distributed_c10d.py", "c10d_logger.py", "_functional_collectives.py"):
        assert framework_of(os.path.join(torch_dir, "distributed", api)) is None
    assert framework_of(os.path.join(torch_dir, "_inductor", "scheduler.py")) is None
    assert framework_of(str(JOBS / JOB)) is None
    assert framework_of("<eval_with_key>.3") is None
    lightning = pytest.importorskip("lightning")
    inside = os.path.join(os.path.dirname(lightning.__file__), "pytorch", "strategies", "ddp.py")
    assert framework_of(inside) == "Lightning"


def test_a_site_says_the_framework_frame_the_same_way_in_summaries_and_reports():
    from distdoctor.diagnosis.report import site_text as report_line
    from distdoctor.findings import callsite_of, site_phrase
    raw = {"file": "/job/train.py", "line": 82, "function": "main", "call": "trainer.fit",
           "framework": {"name": "Lightning", "function": "DDPStrategy.barrier",
                         "file": "/site/lightning/pytorch/strategies/ddp.py", "line": 290}}
    entry = callsite_of(1, raw)
    assert entry["framework"]["function"] == "DDPStrategy.barrier"
    assert site_phrase(entry) == (" in Lightning's DDPStrategy.barrier, from trainer.fit "
                                  "at train.py:82")
    assert report_line(entry) == ("rank 1: /job/train.py:82 in main (trainer.fit, in "
                                  "Lightning's DDPStrategy.barrier)")
    hf = dict(raw, framework=dict(raw["framework"], name="HF Transformers"))
    assert "in HF Transformers' DDPStrategy.barrier" in site_phrase(hf)
    plain = callsite_of(0, {"file": "/job/train.py", "line": 40, "function": "main"})
    assert "framework" not in plain
    assert site_phrase(plain, function=True) == " at train.py:40 in main"
