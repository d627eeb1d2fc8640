"""A nanoGPT-style trainer of our own (tests/jobs/frameworks/nanogpt_style.py), 2 gloo
ranks under torchrun: rank 0 alone evaluates and writes a checkpoint every few
iterations, by design; with --bug it also all-reduces its eval loss alone. The finding
names rank 0's line and the step as the optimizer steps taken, which the job printed."""

from __future__ import annotations

import json
import re
import sys

import pytest
from conftest import JOBS, marker_lines, run_cli

pytestmark = pytest.mark.timeout(300)  # a hard stop over run_cli's own

JOB = "frameworks/nanogpt_style.py"


def test_rank0_only_eval_collective_is_named_at_its_step(tmp_path):
    run_dir = tmp_path / "run"
    res = run_cli(["run", "--run-dir", str(run_dir), "--grace", "2", "--hang-timeout", "5",
                   "--on-hang", "kill", "--", sys.executable, "-m", "torch.distributed.run",
                   "--nproc-per-node", "2", str(JOBS / JOB), "--iters", "30", "--bug"],
                  timeout=180, run_dir=run_dir)
    printed = re.search(r"bug after (\d+) optimizer steps", res.stdout + res.stderr)
    assert printed, res.stdout[-2000:] + res.stderr[-2000:]
    findings = json.loads((run_dir / "findings.json").read_text())["findings"]
    mismatch = [f for f in findings if f["kind"] == "mismatch" and f["ranks"] == [0]]
    assert len(mismatch) == 1, findings
    f = mismatch[0]
    assert f["details"]["span"] == f"step {printed.group(1)}", f["summary"]
    site = next(c for c in f["callsites"] if c["rank"] == 0)
    assert (site["file"], site["line"]) == (str(JOBS / JOB), marker_lines(JOB)["culprit"])
    # no finding blames rank 1, which only waited
    assert not [x for x in findings if x["severity"] == "error" and 1 in x["ranks"]], findings
