"""PyTorch's own distributed test suite under `distdoctor run`: a peer's tests as ours.

A subset of torch's `DistributedTest._DistTestBase` (collectives, p2p, DDP, monitored
barrier, subgroups; tests/jobs/torch_suite) runs under `distdoctor run`, which traces every
rank each test spawns. distdoctor must not change any test's outcome, and must record
exactly the ops each rank issued: each test's ranks are one incarnation in the run dir,
found by the pids the ranks write down. CI compares the traced outcomes with the bare
ones recorded for the pinned torch (CI_OUTCOMES); the extended tier (`pytest -m
extended`) runs the suite bare as well, on a few more tests, and compares the two runs
test by test. The wider run is benchmarks/torch_suite.py.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from conftest import JOBS

sys.path.insert(0, str(JOBS / "torch_suite"))
from harness import CI_COUNTS, CI_OUTCOMES, op_counts, run_suite, traced_runs  # noqa: E402

TESTS = list(CI_COUNTS)
# CI's share (every test spawns its ranks afresh, ~7 s each here): the sync all_reduce,
# the plain send/recv, the whole-group new_group, the gather and the test skipped inside
# its ranks have twins here (the async all_reduce, any-source recv and isend, the
# monitored barrier's subgroup, the broadcast's root, the test skipped in the parent)
CI_TESTS = [t for t in TESTS if t not in (
    "test_all_reduce_sum", "test_send_recv", "test_all_reduce_full_group_sum", "test_gather",
    "test_all_reduce_group_sum")]
pytestmark = pytest.mark.timeout(540)  # each run has its own limit


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    work = tmp_path_factory.mktemp("torch_suite")
    traced = run_suite(CI_TESTS, work / "traced", run_dir=work / "run", timeout=240)
    return traced, work / "run"


def test_same_outcome_test_by_test_under_distdoctor(runs):
    traced, _ = runs
    # the bare outcomes of this torch (pinned in CI): the extended tier checks them bare
    differ = {t: (CI_OUTCOMES[t], traced.outcomes[t], traced.messages.get(t, "")[:500])
              for t in CI_TESTS if CI_OUTCOMES[t] != traced.outcomes[t]}
    assert not differ, traced.stderr[-3000:]
    # distdoctor run passes the wrapped command's exit code through, and leaves nothing
    assert traced.returncode == 0, traced.stderr[-3000:]
    assert traced.left_behind == []


def test_bare_and_traced_agree_test_by_test(tmp_path):
    """The extended tier: every test of the subset, bare and traced."""
    bare = run_suite(TESTS, tmp_path / "bare", timeout=240)
    # guards the comparison below: a suite that could not run here would agree trivially
    assert bare.outcomes == CI_OUTCOMES, (bare.messages, bare.stderr[-3000:])
    traced = run_suite(TESTS, tmp_path / "traced", run_dir=tmp_path / "run", timeout=240)
    differ = {t: (bare.outcomes[t], traced.outcomes[t], traced.messages.get(t, "")[:500])
              for t in TESTS if bare.outcomes[t] != traced.outcomes[t]}
    assert not differ, traced.stderr[-3000:]
    assert traced.returncode == bare.returncode == 0, traced.stderr[-3000:]
    assert traced.left_behind == bare.left_behind == []
    by_test, stray = traced_runs(tmp_path / "run", traced.records)
    assert not stray, f"incarnations no test claimed: {stray}"
    counts = {t: op_counts(r) for t, r in by_test.items()}
    assert counts == {t: {0: c[0], 1: c[1]} for t, c in CI_COUNTS.items() if c is not None}


@pytest.fixture(scope="module")
def traced_runs_by_test(runs):
    _, run_dir = runs
    by_test, stray = traced_runs(run_dir, runs[0].records)
    assert not stray, f"incarnations no test claimed: {stray}"
    return by_test


def test_traced_op_counts_are_the_ops_each_rank_issued(traced_runs_by_test):
    counts = {t: op_counts(runs) for t, runs in traced_runs_by_test.items()}
    assert counts == {t: {0: c[0], 1: c[1]} for t, c in CI_COUNTS.items()
                      if c is not None and t in CI_TESTS}


def test_findings_only_where_a_test_fails_a_rank_on_purpose(runs, traced_runs_by_test):
    _, run_dir = runs
    test_of = {run.incarnation: t for t, incs in traced_runs_by_test.items() for run in incs}
    findings = json.loads((run_dir / "findings.json").read_text())["findings"]
    where = {(test_of.get(f.get("details", {}).get("incarnation", 0)), f["kind"]) for f in findings}
    # rank 1 stays out of rank 0's monitored barrier in that test: a hang it names (rank
    # 1 never joined) and the error rank 0 got; every other test is clean
    assert {t for t, _ in where} == {"test_monitored_barrier_gloo_subgroup"}, findings
    assert "comm_error" in {k for _, k in where}


def test_callsites_name_the_line_in_torchs_test_base(traced_runs_by_test):
    files = {e.callsite["file"] if e.callsite else None
             for runs in traced_runs_by_test.values() for run in runs
             for events in run.events.values() for e in events}
    assert {Path(f).name if f else None for f in files} == {"distributed_test.py"}
