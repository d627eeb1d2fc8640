"""Small buggy programs of classic kinds, written fresh (not corpus copies), on real gloo
jobs (tests/jobs/fresh/): the culprit rank, the line and the reason must hold where an
earlier reading went wrong.
- a `continue` in a batch loop inside an epoch loop skips a DDP step on one rank: the
  skip is the reason, not "left the epoch loop";
- a barrier in an `except` only one rank enters, 2 ranks: the rank that raised strayed;
- one all_reduce line in a `range` loop with float16 on one rank from step 2, or MAX
  against SUM: another dtype or op on one rank, not the loop's order; the dtype is
  blamed on the rank that changed it, the op (different from the start) is a tie."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import JOBS, marker_sets, run_cli

FRESH = JOBS / "fresh"


def _run(job: Path, run_dir: Path, *args: str):
    proc = run_cli(["run", "--nproc", "2", "--run-dir", str(run_dir), "--grace", "2",
                    "--on-hang", "kill", "--", str(job), *args], timeout=90, run_dir=run_dir)
    findings = json.loads((run_dir / "findings.json").read_text())["findings"]
    said = "\n".join(f"{f['kind']} {f['ranks']} {f['summary']}" for f in findings)
    mismatch = next((f for f in findings if f["kind"] == "mismatch"), None)
    assert mismatch is not None, said
    return proc, mismatch, said


@pytest.mark.timeout(120)
def test_a_batch_skipped_inside_the_epoch_loop_is_the_reason(tmp_path):
    job = FRESH / "skip_batch_epochs.py"
    _, f, said = _run(job, tmp_path / "run")
    marks = marker_sets(job)
    assert f["ranks"] == [1], said
    assert f["details"]["branch"]["line"] in marks["branch"], said
    assert f["details"]["branch"]["exit_line"] in marks["skip"], said
    assert "skipped an iteration" in f["summary"], said


@pytest.mark.timeout(120)
def test_the_rank_in_the_except_handler_strayed(tmp_path):
    job = FRESH / "barrier_in_except.py"
    _, f, said = _run(job, tmp_path / "run")
    marks = marker_sets(job)
    assert f["ranks"] == [1], said
    assert f["details"]["branch"]["line"] in marks["branch"], said
    assert {c["line"] for c in f["callsites"] if c.get("rank") == 1} & marks["op"], said
    assert "raised" in f["details"]["evidence"], said


@pytest.mark.timeout(120)
def test_another_dtype_on_one_rank_is_not_the_loops_order(tmp_path):
    _, f, said = _run(FRESH / "dtype_from_step.py", tmp_path / "run")
    assert f["ranks"] == [1], said
    assert "order" not in f["details"] and "different order" not in f["summary"], said
    assert "float16" in f["summary"], said


@pytest.mark.timeout(120)
def test_another_reduce_op_from_the_start_is_a_tie_not_the_loops_order(tmp_path):
    _, f, said = _run(FRESH / "dtype_from_step.py", tmp_path / "run", "op")
    assert f["ranks"] == [] and f["details"].get("tie") == [0, 1], said
    assert "order" not in f["details"] and "different order" not in f["summary"], said
    assert "reduce_op" in f["summary"], said
