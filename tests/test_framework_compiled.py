"""Call sites through torch.compile: a real 2-rank gloo job whose compiled function takes
another branch on one rank (tests/jobs/frameworks/compiled_branch.py). inductor issues
every collective from its generated module, aot_eager from an FX graph module's code;
the finding, `show`, and the Perfetto and Flight Recorder exports name the user's lines
inside the compiled function."""

from __future__ import annotations

import json

import pytest
from conftest import JOBS, marker_lines, own_sites, run_cli

pytestmark = pytest.mark.timeout(420)  # a hard stop over run_cli's own (240 + 2 x 60)

JOB = "frameworks/compiled_branch.py"


def _sites(run_dir) -> list[dict]:
    from distdoctor.runlog.run import read_run

    run = read_run(run_dir)
    return [ev.callsite for evs in run.events.values() for ev in evs
            if ev.kind != "span" and ev.callsite]


@pytest.mark.parametrize("backend", ["inductor", "aot_eager"])
def test_compiled_branch_mismatch_names_the_users_lines(tmp_path, backend):
    run_dir = tmp_path / "run"
    res = run_cli(["run", "--nproc", "2", "--run-dir", str(run_dir), "--grace", "2",
                   "--on-hang", "kill", "--", str(JOBS / JOB)], timeout=240,
                  run_dir=run_dir, env={"COMPILE_BACKEND": backend})
    lines = marker_lines(JOB)
    findings = json.loads((run_dir / "findings.json").read_text())["findings"]
    mismatch = [f for f in findings if f["kind"] == "mismatch"]
    assert len(mismatch) == 1, res.stdout + res.stderr
    by_rank = own_sites(mismatch[0])
    assert by_rank[0]["line"] == lines["other"] and by_rank[1]["line"] == lines["culprit"]
    assert all(c["file"].endswith("compiled_branch.py") and c["function"] == "sync_stats"
               for c in by_rank.values())

    # every op of the run, the healthy steps' included, is at a line of the job's own
    sites = _sites(run_dir)
    assert sites and all(s["file"].endswith("compiled_branch.py") for s in sites), sites
    assert {s["line"] for s in sites} == {lines["healthy"], lines["graph_break"],
                                          lines["other"], lines["culprit"]}
    assert {s.get("called_from", "").rsplit(":", 1)[-1] for s in sites
            if s["line"] in (lines["other"], lines["culprit"])} == {f"{lines['caller']} in main"}

    show = run_cli(["show", str(run_dir), "--rank", "1"], timeout=60, env={"COLUMNS": "200"})
    assert f"compiled_branch.py:{lines['culprit']}" in show.stdout
    assert "torchinductor" not in show.stdout and "eval_with_key" not in show.stdout

    trace = tmp_path / "trace.json"
    run_cli(["export", str(run_dir), "--perfetto", str(trace)], timeout=60)
    assert f"compiled_branch.py:{lines['culprit']}" in trace.read_text()
    assert "torchinductor" not in trace.read_text()
    assert "eval_with_key" not in trace.read_text()
