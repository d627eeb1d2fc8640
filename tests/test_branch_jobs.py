"""The branch that split the ranks, on real gloo jobs (issue 41): one job per kind of
condition (tests/jobs/parted/branch_kinds.py), 2 ranks where no majority can name the
culprit and 4 for an even split; the finding blames the rank the condition names, says
the branch's line and condition in `details.branch`, and the healthy shapes stay quiet.
Also the order of one loop's collectives (set_order_2rank.py) and a crash mid-run said
as mid-run, not at start-up (crashes/raises_midrun.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import JOBS, marker_sets, run_cli

JOB = JOBS / "parted" / "branch_kinds.py"


def _run(args, nproc: int, run_dir: Path, timeout=100):
    proc = run_cli(["run", "--nproc", str(nproc), "--run-dir", str(run_dir), "--grace", "2",
                    "--on-hang", "kill", "--", *map(str, args)],
                   timeout=timeout, run_dir=run_dir)
    return proc, json.loads((run_dir / "findings.json").read_text())["findings"]


def _said(findings) -> str:
    return "\n".join(f"{f['kind']} {f['severity']} {f['ranks']} {f['summary']}"
                     for f in findings)


# (kind, ranks) -> (culprits, the condition's kind); at 4 ranks a majority stands, and
# the branch still says why
KINDS = {
    ("rank_name", 2): ([0], "rank"),
    ("rank_name", 4): ([0], "rank"),
    ("rank_bound", 2): ([0], "rank"),
    ("framework_prop", 2): ([0], "rank"),
    ("decorator", 2): ([0], "rank"),
    ("data_none", 2): ([1], "data"),
    ("early_return", 2): ([1], "data"),
    ("early_return", 4): ([1], "data"),
    ("loop_break", 2): ([1], "rank"),
    ("except_continue", 2): ([1], "exception"),
    ("except_continue", 4): ([1], "exception"),
    ("rank_gate", 2): ([0], "rank"),
    ("even_split", 4): ([0, 2], "rank"),
}


@pytest.mark.timeout(150)
@pytest.mark.parametrize("kind,nproc", sorted(KINDS), ids=[f"{k}-{n}" for k, n in sorted(KINDS)])
def test_the_condition_names_the_rank_that_strayed(kind, nproc, tmp_path):
    culprits, cond = KINDS[(kind, nproc)]
    proc, findings = _run([JOB, kind], nproc, tmp_path / "run")
    assert proc.returncode != 0
    errors = [f for f in findings if f["severity"] == "error" and f["kind"] in
              ("mismatch", "hang", "deadlock")]
    assert errors, _said(findings)
    f = errors[0]
    assert f["ranks"] == culprits, _said(findings)
    # nothing of severity error blames a rank the condition did not name
    assert all(set(g["ranks"]) <= set(culprits) for g in findings
               if g["severity"] == "error"), _said(findings)
    marks = marker_sets(JOB)
    lines = {c["line"] for c in f["callsites"] if c["rank"] in culprits}
    # the culprit's own line: its op, its way out, or the branch it took
    assert lines & (marks["parted"] | marks.get("branch", set())), (f["callsites"],
                                                                   _said(findings))
    branch = f["details"]["branch"]
    assert branch["kind"] == cond, branch
    if kind != "decorator":  # the decorator's line is the def's, not a marked one
        assert branch["line"] in marks["branch"], branch
    arms = {tuple(a["ranks"]) for a in branch["arms"]}
    assert tuple(culprits) in arms, branch
    assert branch["condition"] in f["summary"]


@pytest.mark.timeout(150)
@pytest.mark.parametrize("mode", ["bug", "healthy"])
def test_accelerates_main_process_first_barrier_is_never_the_fault(mode, tmp_path):
    pytest.importorskip("accelerate")
    job = JOBS / "parted" / "accelerate_main_first.py"
    proc, findings = _run([job, mode], 2, tmp_path / "run")
    if mode == "healthy":
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert [f for f in findings if f["severity"] in ("error", "warning")] == [], \
            _said(findings)
        return
    f = next(f for f in findings if f["severity"] == "error")
    assert f["ranks"] == [0], _said(findings)  # the collective in the block, not the barrier
    assert {c["line"] for c in f["callsites"] if c["rank"] == 0} & marker_sets(job)["parted"]
    assert f["details"]["branch"]["line"] in marker_sets(job)["designed"]
    assert "main_process_first" in f["summary"]


@pytest.mark.timeout(150)
def test_the_healthy_shapes_of_those_branches_are_quiet(tmp_path):
    proc, findings = _run([JOB, "healthy"], 2, tmp_path / "run")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [f for f in findings if f["severity"] in ("error", "warning")] == [], \
        _said(findings)


@pytest.mark.timeout(150)
def test_a_loop_over_a_set_is_said_as_the_order_not_a_culprit(tmp_path):
    job = JOBS / "parted" / "set_order_2rank.py"
    proc, findings = _run([job], 2, tmp_path / "run")
    assert proc.returncode != 0
    f = next(f for f in findings if f["kind"] == "mismatch")
    assert f["ranks"] == [] and "order" in f["details"], _said(findings)
    marks = marker_sets(job)
    assert f["details"]["order"]["line"] in marks["loop"]
    assert "different order" in f["summary"] and "set" in f["summary"]
    assert {c["line"] for c in f["callsites"]} & marks["op"]


@pytest.mark.timeout(150)
def test_every_rank_raising_mid_run_is_not_a_start_up_failure(tmp_path):
    job = JOBS / "crashes" / "raises_midrun.py"
    run_dir = tmp_path / "run"
    proc, _ = _run([job, "keyerror"], 2, run_dir)
    assert proc.returncode != 0
    out = run_cli(["diagnose", str(run_dir), "--json"], timeout=60)
    findings = json.loads(out.stdout)["findings"]
    crashes = [f for f in findings if f["kind"] == "crash" and f["severity"] == "error"]
    assert crashes, _said(findings)
    assert not any("at start-up" in f["summary"] for f in findings), _said(findings)
    said = next(f for f in crashes if "KeyError" in f["summary"])
    assert "mid-run" in said["summary"] and "all_reduce #" in said["summary"], said["summary"]
