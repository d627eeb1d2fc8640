"""The log families live, under `distdoctor run`: a failure every rank shares is one finding,
and an exception on one rank is that exception (with its line), whether or not the rank has
exited when the others are found waiting."""

from __future__ import annotations

import json

import pytest

from tests.conftest import marker_lines, run_job


def _findings(run_dir):
    return json.loads((run_dir / "findings.json").read_text())["findings"]


@pytest.mark.timeout(150)
def test_a_start_up_failure_on_every_rank_is_one_finding(tmp_path):
    run_dir = tmp_path / "run"
    res = run_job("live_logs/startup_usage.py", 3, run_dir, timeout=120)
    assert res.returncode != 0
    errors = [f for f in _findings(run_dir) if f["severity"] == "error"]
    assert len(errors) == 1, errors
    (f,) = errors
    assert f["kind"] == "crash" and f["ranks"] == [0, 1, 2]
    assert "every rank" in f["summary"] and "--data-dir" in f["summary"], f["summary"]


@pytest.mark.timeout(150)
def test_an_exception_on_one_rank_is_named_with_its_line_not_a_hang(tmp_path):
    run_dir = tmp_path / "run"
    res = run_job("live_logs/ddp_raise.py", 3, run_dir, timeout=120)
    assert res.returncode != 0
    found = _findings(run_dir)
    errors = [f for f in found if f["severity"] == "error"]
    assert errors, found
    top = errors[0]
    assert top["kind"] == "crash" and top["ranks"] == [1], top
    assert "ValueError" in top["summary"] and "bad batch at step 3" in top["summary"]
    line = marker_lines("live_logs/ddp_raise.py")["raise"]
    assert any(c.get("line") == line and c["file"].endswith("ddp_raise.py")
               for c in top["callsites"]), top["callsites"]
    assert not [f for f in errors if f["kind"] == "hang" and 1 in f["ranks"]], errors
