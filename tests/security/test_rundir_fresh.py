"""Run dirs in states the earlier hostile-run-dir checks (test_hostile_rundirs.py) did not
make, produced by real jobs under `distdoctor run`: a second incarnation that appears
while the job still runs, and a kept-sources manifest no parser takes. The live engine
still names the hang and `--on-hang kill` still stops the job; every reader after the
fact says what it can read, never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import marker_lines, run_cli, run_job
from test_hostile_rundirs import _cli, _sane

NESTED = "[" * 100_000 + "]" * 100_000


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


@pytest.mark.timeout(120)
def test_a_kept_sources_manifest_nested_too_deep_is_no_manifest(tmp_path):
    """sources/manifest.json nested 100,000 deep (json.loads raised RecursionError): `run`
    into a dir holding it said 'cannot start the live diagnosis' and ran nothing; diagnose
    said 'a bug in distdoctor'; show, watch --once, pack and export printed a traceback.
    Now it counts as no manifest: the run goes on (its ranks write a manifest of their
    own), and the readers read the run as one that kept nothing."""
    run_dir = tmp_path / "run"
    (run_dir / "sources").mkdir(parents=True)
    manifest = run_dir / "sources" / "manifest.json"
    manifest.write_text(NESTED)
    res = run_job("many_ops.py", 2, run_dir, "5", timeout=60)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr[-3000:]
    assert "2 rank(s) traced" in res.stderr, res.stderr[-3000:]
    manifest.write_text(NESTED)  # the ranks wrote theirs over it: put it back
    said = _sane(_cli(["diagnose", run_dir]), codes=(0,))
    assert "no findings" in said.lower(), said
    for args in (["show", run_dir], ["watch", "--once", run_dir],
                 ["export", run_dir, "--perfetto", tmp_path / "t.json"],
                 ["pack", run_dir, "-o", tmp_path / "run.ddpack"]):
        _sane(_cli(args))
    shown = _sane(_cli(["show", run_dir, "--rank", "1"]))
    assert "all_reduce" in shown, shown
