"""Why the ranks parted, said from what each rank did (issue 48): real gloo jobs
(tests/jobs/parted/why_kinds.py) whose explanation was wrong while the culprit was right,
and unit readings of the same program at the lines those jobs recorded.

- a rank that skips a collective on a subgroup equal to the world made no call on a
  wrong group: it skipped one (and "undefined", torch's name for a group made without a
  description, is never said);
- a rank guard nested in a periodic one is the branch, not the periodic `if`;
- the early return inside the function a condition calls is the branch, not the
  caller's `if`;
- a rank that leaves the batch loop left that loop, not the loop over the parameters
  inside it."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace as NS

import pytest
from conftest import JOBS, marker_sets, run_cli

from distdoctor.diagnosis.parting import branch as B
from distdoctor.diagnosis.parting import source as S

JOB = JOBS / "parted" / "why_kinds.py"


def _run(kind: str, nproc: int, run_dir: Path) -> list[dict]:
    proc = run_cli(["run", "--nproc", str(nproc), "--run-dir", str(run_dir), "--grace", "2",
                    "--on-hang", "kill", "--", str(JOB), kind],
                   timeout=100, run_dir=run_dir)
    assert proc.returncode != 0, proc.stderr[-2000:]
    return json.loads((run_dir / "findings.json").read_text())["findings"]


def _said(findings) -> str:
    return "\n".join(f"{f['kind']} {f['severity']} {f['ranks']} {f['summary']}"
                     for f in findings)


def _the_error(findings) -> dict:
    errors = [f for f in findings if f["severity"] == "error"]
    assert len(errors) == 1, _said(findings)
    return errors[0]


@pytest.mark.timeout(120)
def test_a_rank_that_skips_a_gather_on_a_world_sized_subgroup_skipped_it(tmp_path):
    findings = _run("skip_world_subgroup", 3, tmp_path / "run")
    f = _the_error(findings)
    marks = marker_sets(JOB)
    assert f["kind"] == "hang" and f["ranks"] == [2], _said(findings)
    assert f["details"]["reason"] == "skipped_collective", f["details"]
    assert "skipped all_gather" in f["summary"] and "wrong" not in f["summary"], f["summary"]
    # the claim is backed: the rank issued nothing on the gather's group
    assert f["details"]["issued_in_group"]["2"] == 0, f["details"]
    assert f["details"]["branch"]["line"] in marks["branch"], f["details"]["branch"]
    assert {c["line"] for c in f["callsites"] if c["rank"] == 2} & marks["parted"]
    assert {c["line"] for c in f["callsites"] if c["rank"] != 2} <= marks["other"]
    assert not [g for g in findings if "undefined" in g["summary"]], _said(findings)


@pytest.mark.timeout(120)
def test_a_rank_guard_nested_in_a_periodic_guard_is_the_branch(tmp_path):
    findings = _run("periodic_rank_guard", 2, tmp_path / "run")
    f = _the_error(findings)
    marks = marker_sets(JOB)
    assert f["ranks"] == [0], _said(findings)  # rank 1 did nothing wrong
    branch = f["details"]["branch"]
    assert branch["kind"] == "rank" and branch["line"] in marks["branch"], branch
    assert branch["condition"] in f["summary"] and "step % 2" not in f["summary"]
    assert {c["line"] for c in f["callsites"] if c["rank"] == 0} & (
        marks["parted"] | marks["caller"])


@pytest.mark.timeout(120)
def test_an_early_return_inside_the_called_condition_is_the_branch(tmp_path):
    findings = _run("callee_return", 2, tmp_path / "run")
    f = _the_error(findings)
    marks = marker_sets(JOB)
    assert f["ranks"] == [1], _said(findings)
    branch = f["details"]["branch"]
    assert branch["function"] == "should_sync" and branch["line"] in marks["branch"], branch
    assert branch["condition"] == "if lr < 0.1:" and branch["exit_line"] == branch["line"] + 1
    assert "should_sync(lr)" in f["summary"], f["summary"]  # the caller's line is kept


def _at(line: int, function: str = "<module>") -> NS:
    return NS(callsite={"file": str(JOB), "line": line, "function": function})


def _line_of(text: str) -> int:
    return next(n for n, t in enumerate(JOB.read_text().splitlines(), 1) if text in t)


def test_a_rank_that_leaves_the_batch_loop_left_it_not_the_loop_inside():
    """The lines the real run recorded: both ranks all-reduced a parameter (line of
    `dist.all_reduce(p)`); rank 1 then reached the final barrier, rank 0 the next
    parameter's all_reduce."""
    S.read.cache_clear()
    per_param = _line_of("dist.all_reduce(p)")
    final = max(n for n, t in enumerate(JOB.read_text().splitlines(), 1)
                if t.startswith("dist.barrier()"))
    b = B.find(_at(per_param), _at(final), _at(per_param))
    assert b is not None and b.statement == "if", b
    assert b.line in marker_sets(JOB)["branch"] and b.exit_line == b.line + 1, b
    assert "for p in params" not in b.condition and b.did[0].startswith("broke out"), b


@pytest.mark.timeout(120)
def test_a_slow_rank_under_a_short_pg_timeout_is_a_straggler_not_a_hang(tmp_path):
    run_dir = tmp_path / "run"
    proc = run_cli(["run", "--nproc", "2", "--run-dir", str(run_dir), "--grace", "2",
                    "--", str(JOB), "slow_sampler"], timeout=100, run_dir=run_dir,
                   env={"PARTED_GLOO_TIMEOUT": "3"})
    assert proc.returncode != 0
    findings = json.loads((run_dir / "findings.json").read_text())["findings"]
    f = _the_error(findings)
    assert f["kind"] == "straggler" and f["ranks"] == [1], _said(findings)
    assert f["details"]["reason"] == "timeout_while_busy" and f["details"]["timeout_s"] == 3
    assert "timeout of 3 s" in f["summary"] and "never joined" not in f["summary"]
    # where its time went: the line it computes at, first among its call sites
    assert f["callsites"][0]["rank"] == 1, f["callsites"]
    assert f["callsites"][0]["line"] in marker_sets(JOB)["computing"], f["callsites"]
    assert not [g for g in findings if g["kind"] == "hang" and g["severity"] == "error"]


@pytest.mark.timeout(120)
def test_the_healthy_shape_of_the_periodic_save_is_quiet(tmp_path):
    """Every rank calls the collective save under the periodic guard: no finding of
    severity error or warning (the rank guard read as a split only where it splits)."""
    run_dir = tmp_path / "run"
    proc = run_cli(["run", "--nproc", "2", "--run-dir", str(run_dir), "--grace", "2",
                    "--on-hang", "kill", "--", str(JOB), "healthy"], timeout=100,
                   run_dir=run_dir)
    assert proc.returncode == 0, proc.stderr[-2000:]
    findings = json.loads((run_dir / "findings.json").read_text())["findings"]
    assert not [f for f in findings if f["severity"] in ("error", "warning")], \
        _said(findings)
