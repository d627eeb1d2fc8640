"""Small buggy programs of classic kinds, written fresh (not corpus copies), on real gloo
jobs (tests/jobs/fresh/): the culprit rank, the line and the reason must hold where an
earlier reading went wrong.
- a `continue` in a batch loop inside an epoch loop skips a DDP step on one rank: the
  skip is the reason, not "left the epoch loop";
- a barrier in an `except` only one rank enters, 2 ranks: the rank that raised strayed;
- one all_reduce line in a `range` loop with float16 on one rank from step 2, or MAX
  against SUM: another dtype or op on one rank, not the loop's order; the dtype is
  blamed on the rank that changed it, the op (different from the start) is a tie;
- a lengths all_reduce where one rank sends float64 bits the others read as an int64:
  the allocation of that size, just after the all_reduce, is the mismatch's consequence,
  never "host memory exhausted" nor an error of its own;
- a pipeline's last stage receiving from stage 0 instead of the stage that feeds it: the
  receiver named the wrong peer, not stage 0 that "posted no matching send"."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import JOBS, marker_sets, run_cli

FRESH = JOBS / "fresh"


def _run(job: Path, run_dir: Path, *args: str, nproc: int = 2, kind: str = "mismatch"):
    proc = run_cli(["run", "--nproc", str(nproc), "--run-dir", str(run_dir), "--grace", "2",
                    "--on-hang", "kill", "--", str(job), *args], timeout=90, run_dir=run_dir)
    findings = json.loads((run_dir / "findings.json").read_text())["findings"]
    said = "\n".join(f"{f['kind']} {f['severity']} {f['ranks']} {f['summary']}"
                     for f in findings)
    mismatch = next((f for f in findings if f["kind"] == kind), None)
    assert mismatch is not None, said
    return proc, mismatch, said


def _rank_1_at_its_branch(job: Path, run_dir: Path):
    """The mismatch, blamed on rank 1 at the job's `# expect: branch` line."""
    _, f, said = _run(job, run_dir)
    marks = marker_sets(job)
    assert f["ranks"] == [1], said
    assert f["details"]["branch"]["line"] in marks["branch"], said
    return f, said, marks


@pytest.mark.timeout(120)
def test_a_batch_skipped_inside_the_epoch_loop_is_the_reason(tmp_path):
    f, said, marks = _rank_1_at_its_branch(FRESH / "skip_batch_epochs.py", tmp_path / "run")
    assert f["details"]["branch"]["exit_line"] in marks["skip"], said
    assert "skipped an iteration" in f["summary"], said


@pytest.mark.timeout(120)
def test_the_rank_in_the_except_handler_strayed(tmp_path):
    f, said, marks = _rank_1_at_its_branch(FRESH / "barrier_in_except.py", tmp_path / "run")
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


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["alloc", "overflow"])
def test_an_allocation_of_a_garbage_length_is_no_fault_of_the_rank_that_received_it(
        tmp_path, how):
    # the CPU allocation of the received size fails just after the lengths' all_reduce
    # completed (or its storage size overflows): the mismatch's consequence, live and
    # post mortem alike
    run_dir = tmp_path / "run"
    proc, f, said = _run(FRESH / "gather_lengths_dtype.py", run_dir, how)
    assert "host memory exhausted" not in proc.stderr, proc.stderr[-3000:]
    findings = json.loads((run_dir / "findings.json").read_text())["findings"]
    told = [g for g in findings if g["details"].get("source") == "log"
            and g["kind"] == "crash" and 0 in g["ranks"]]
    assert told and all(g["severity"] == "warning" and g["details"].get(
        "consequence_of_mismatch") for g in told), said
    assert f["ranks"] == [1] and "float64" in f["summary"], said
    # rank 0 only received the bad length: no error of its own
    assert not [g for g in findings if g["severity"] == "error" and 0 in g["ranks"]], said


@pytest.mark.timeout(120)
def test_a_recv_from_a_rank_that_never_sends_to_it_names_the_wrong_peer(tmp_path):
    job = FRESH / "recv_wrong_src.py"
    _, f, said = _run(job, tmp_path / "run", nproc=3, kind="hang")
    marks = marker_sets(job)
    assert f["ranks"] == [2] and "wrong peer" in f["summary"], said
    sites = {(c["rank"], c["line"]) for c in f["callsites"]}
    assert {(2, line) for line in marks["op"]} & sites, said
    assert {(1, line) for line in marks["feeder"]} & sites, said
