"""Run dirs in states the earlier hostile-run-dir checks (test_hostile_rundirs.py) did not
make, produced by real jobs under `distdoctor run`: a second incarnation that appears
while the job still runs. The live engine still names the hang and `--on-hang kill`
still stops the job; every reader after the fact says what it can read, never a
traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import marker_lines, run_cli


@pytest.mark.timeout(120)
def test_a_helper_group_started_by_a_rank_never_hides_the_jobs_hang(tmp_path):
    """Rank 1 runs a helper that makes a one-rank group of its own (traced: a newer
    incarnation, beside the job's), then never joins the next all_reduce. Only the
    newest incarnation's ranks had their progress read and only its findings could stop
    the job: rank 1's last reading (taken while the helper ran) stood for good, the wait
    stayed a long wait, and `--on-hang kill` never fired (the job ran until killed)."""
    run_dir = tmp_path / "run"
    job = "security/helper_group_then_hang.py"
    res = run_cli(["run", "--nproc", "2", "--run-dir", str(run_dir), "--grace", "2",
                   "--on-hang", "kill", "--", str(Path(__file__).parent.parent / "jobs" / job)],
                  timeout=60, run_dir=run_dir)
    err = res.stderr
    assert "stopping the job (--on-hang kill)" in err and res.returncode != 0, err[-3000:]
    assert "Traceback" not in err and "pass of the live diagnosis failed" not in err, err
    findings = json.loads((run_dir / "findings.json").read_text())["findings"]
    hangs = [f for f in findings if f["kind"] == "hang" and f["severity"] == "error"]
    assert len(hangs) == 1 and hangs[0]["ranks"] == [1], findings
    assert hangs[0]["details"].get("incarnation") == 0, hangs[0]  # the job's, not the helper's
    stuck = marker_lines(job)["stuck"]
    assert any(c["rank"] == 1 and c["line"] == stuck for c in hangs[0]["callsites"]), hangs[0]
    assert not [f for f in findings if f["kind"] in ("internal", "crash")], findings
