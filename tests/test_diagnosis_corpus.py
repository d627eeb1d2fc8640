"""The classic distributed bugs, each a small real program (tests/jobs/bugs/), run under
`distdoctor run`: the right finding names the right rank(s) and the culprit's line, and
nothing else of severity error blames anybody else. A healthy job yields no finding."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import JOBS, marker_sets, run_cli

BUGS = JOBS / "bugs"

# job -> (ranks, finding kind, culprit ranks, marker of the culprit's line)
CASES = {
    "rank0_only_broadcast": (4, "mismatch", [0], "culprit"),
    "uneven_batches": (4, "mismatch", [3], "culprit"),
    "swallowed_exception": (4, "hang", [1], "others"),
    "wrong_group": (4, "mismatch", [1], "culprit"),
    "p2p_deadlock": (2, "deadlock", [0, 1], "culprit"),
    "group_order_deadlock": (2, "deadlock", [0, 1], "culprit"),
    "dtype_mismatch": (4, "mismatch", [2], "culprit"),
    "shape_mismatch": (4, "mismatch", [3], "site"),
    "oom_killed": (4, "crash", [2], "site"),
    "stuck_outside": (4, "hang", [3], "others"),
}


def _markers(job: str) -> dict[str, set[int]]:
    return marker_sets(BUGS / f"{job}.py")


def _run(job: str, nproc: int, run_dir: Path):
    return run_cli(["run", "--nproc", str(nproc), "--run-dir", str(run_dir), "--grace", "2",
                    "--hang-timeout", "3", "--on-hang", "kill", "--", str(BUGS / f"{job}.py")],
                   timeout=90, run_dir=run_dir)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("job", sorted(CASES))
def test_bug_is_diagnosed(job, tmp_path):
    nproc, kind, culprits, marker = CASES[job]
    run_dir = tmp_path / "run"
    proc = _run(job, nproc, run_dir)
    assert proc.returncode != 0, "a broken job must not exit 0"
    findings = json.loads((run_dir / "findings.json").read_text())["findings"]
    described = "\n".join(f"{f['kind']} {f['ranks']} {f['summary']}" for f in findings)
    main = [f for f in findings if f["kind"] == kind and f["severity"] == "error"]
    assert main, f"no {kind} finding:\n{described}"
    f = main[0]
    assert f["ranks"] == culprits, described
    lines = _markers(job)[marker]
    culprit_lines = {c["line"] for c in f["callsites"] if c["rank"] in culprits}
    assert culprit_lines & lines, (culprit_lines, lines, described)
    assert all(c["file"].endswith(f"{job}.py") for c in f["callsites"] if c["rank"] in culprits)
    # nothing else of severity error blames a rank that is not at fault
    for other in findings:
        if other["severity"] == "error":
            assert set(other["ranks"]) <= set(culprits), described
    if job == "stuck_outside":  # outside any collective: its stack says where it is stuck
        assert f["stacks"].get("3"), described
        stuck = [c for c in f["callsites"] if c.get("source") == "stack"]
        assert stuck and stuck[0]["line"] in _markers(job)["stuck"], f["callsites"]
        assert stuck[0]["file"].endswith("stuck_outside.py")
    # the live front end printed it, and the post-mortem agrees
    assert kind.upper() in proc.stderr
    again = run_cli(["diagnose", str(run_dir), "--json"], timeout=60)
    assert again.returncode == 1
    post = json.loads(again.stdout)["findings"]
    assert (kind, tuple(culprits)) in {(g["kind"], tuple(g["ranks"])) for g in post}
    if job == "stuck_outside":  # the live engine's stack and the line read from it, kept
        g = next(g for g in post if g["kind"] == "hang")
        assert g["stacks"].get("3") and g["callsites"][0].get("source") == "stack", g


@pytest.mark.timeout(120)
def test_healthy_job_has_no_findings(tmp_path):
    run_dir = tmp_path / "run"
    proc = run_cli(["run", "--nproc", "3", "--run-dir", str(run_dir), "--hang-timeout", "5",
                    "--", str(JOBS / "all_ops.py")], timeout=90, run_dir=run_dir)
    assert proc.returncode == 0, proc.stderr
    findings = json.loads((run_dir / "findings.json").read_text())["findings"]
    # on a torch whose gloo lacks an op the job tries (and catches: tests/jobs/all_ops.py),
    # that refusal is reported as what it is, a warning; nothing else is
    assert [f for f in findings if "does not support" not in f["summary"]] == []
    assert all(f["severity"] == "warning" for f in findings)
    assert "no findings" in proc.stderr or findings
    again = run_cli(["diagnose", str(run_dir), "--json"], timeout=60)
    assert again.returncode == 0 and json.loads(again.stdout)["findings"] == findings


@pytest.mark.timeout(120)
def test_rank_killed_under_a_wrapped_torchrun_is_the_crash(tmp_path):
    """No launcher exit codes for the ranks: liveness (pid gone, log not closed) tells."""
    run_dir = tmp_path / "run"
    proc = run_cli(["run", "--run-dir", str(run_dir), "--hang-timeout", "5", "--on-hang",
                    "kill", "--", sys.executable, "-m", "torch.distributed.run",
                    "--nproc-per-node", "4", str(BUGS / "oom_killed.py")],
                   timeout=100, run_dir=run_dir)
    assert proc.returncode != 0
    findings = json.loads((run_dir / "findings.json").read_text())["findings"]
    errors = [(f["kind"], f["ranks"]) for f in findings if f["severity"] == "error"]
    assert errors == [("crash", [2])], findings


@pytest.mark.timeout(120)
def test_a_job_that_ends_inside_an_op_is_never_said_to_have_completed_everything(tmp_path):
    """No finding (a second's wait is no hang), but the post-mortem says which op was left
    in flight and who never joined it, instead of "every traced collective completed"."""
    run_dir = tmp_path / "run"
    res = run_cli(["run", "--nproc", "2", "--run-dir", str(run_dir), "--grace", "2", "--",
                   str(JOBS / "waits" / "ended_inside.py")], timeout=90, run_dir=run_dir)
    assert "Traceback" not in res.stderr, res.stderr[-3000:]
    out = run_cli(["diagnose", str(run_dir)])
    assert "matched and completed" not in out.stdout, out.stdout
    assert "all_reduce #3 in group 0" in out.stdout and "never completed" in out.stdout
    assert "rank 1 never joined it" in out.stdout, out.stdout
