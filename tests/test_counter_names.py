"""A plain group that only its members use may be named apart by the others: no finding.

Torch 2.15 numbers a member-named group (`use_local_synchronization=True`) with the counter
that names later plain groups, on its members only (counter_names.py). A plain group all
ranks then create is named one apart on those ranks; where they are members it hangs
(test_member_names.py), where they are not it works: a non-member never uses the name.
"""

from __future__ import annotations

import json

import pytest
from conftest import run_cli
from test_group_creation import _numbers_member_named_groups
from test_member_names import JOB, _counter_cause, _made, _salted

from distdoctor.diagnosis.engine.core import Engine


def test_a_plain_group_named_apart_only_by_non_members_is_no_finding():
    """Ranks 0, 1 make [0, 1] by its members (line 10); then all four create a plain
    new_group([2, 3]) (line 12): "2" on ranks 0, 1, "1" on ranks 2, 3, its members, who
    agree and go on. Before: a mismatch blaming ranks 0, 1 ("its ranks wait on different
    store keys") on a job that works."""
    engine = Engine(hang_timeout_s=None)
    engine.ingest([_made(r, 0, _salted((0, 1), 1), (0, 1), 10) for r in (0, 1)], 0.0)
    engine.ingest([_made(r, 1 if r < 2 else 0, "2" if r < 2 else "1", (2, 3), 12)
                   for r in range(4)], 0.0)
    engine.tick(1.0)
    assert engine.findings() == [], [f.summary for f in engine.findings()]
    # the same names given by two members apart is the cause (as before)
    engine = Engine(hang_timeout_s=None)
    engine.ingest([_made(r, 0, _salted((0, 1), 1), (0, 1), 10) for r in (0, 1)], 0.0)
    engine.ingest([_made(r, 1 if r < 2 else 0, "2" if r < 2 else "1", (1, 2), 12,
                         done=False) for r in range(4)], 0.0)
    engine.tick(1.0)
    [f] = _counter_cause(engine)
    assert [(n["name"], n["ranks"]) for n in f.details["names"]] == [("2", [1]), ("1", [2])]


@pytest.mark.timeout(90)
@pytest.mark.skipif(not _numbers_member_named_groups(),
                    reason="this torch names plain groups by plain groups only: the same "
                    "names on every rank")
def test_the_real_job_whose_non_members_name_a_plain_group_apart_runs_quiet(tmp_path):
    run_dir = tmp_path / "run"
    proc = run_cli(["run", "--nproc", "4", "--run-dir", str(run_dir), "--grace", "2",
                    "--on-hang", "kill", "--", str(JOB), "nonmember"], timeout=60,
                   run_dir=run_dir)
    findings = json.loads((run_dir / "findings.json").read_text())["findings"]
    assert proc.returncode == 0 and findings == [], (
        [f["summary"] for f in findings], proc.stderr[-2000:])
