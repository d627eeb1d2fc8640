"""Ranks held inside group creation, run for real on gloo: by new_group's store barrier
(TORCH_DIST_INIT_BARRIER=1), over every rank, members or not; by members gone into other
creations around a ring; by a rank still computing (a long wait, never an error). And the
job that looks like them and works stays quiet but for that long wait."""

from __future__ import annotations

import json

import pytest
from conftest import JOBS, marker_sets, run_cli
from test_group_creation import _numbers_member_named_groups
from test_member_names import JOB as MEMBER_NAMES_JOB

JOB = JOBS / "bugs" / "creation_waits.py"
BARRIER = {"TORCH_DIST_INIT_BARRIER": "1"}


def _run(mode: str, tmp_path, hang_timeout: str | None = "3", env: dict | None = None,
         job=JOB):
    run_dir = tmp_path / "run"
    timeout = ["--hang-timeout", hang_timeout] if hang_timeout else []
    proc = run_cli(["run", "--nproc", "4", "--run-dir", str(run_dir), "--grace", "1",
                    *timeout, "--on-hang", "kill", "--", str(job), mode], timeout=60,
                   env=env, run_dir=run_dir)
    findings = json.loads((run_dir / "findings.json").read_text())["findings"]
    described = "\n".join(f"{f['kind']} {f['ranks']} {f['summary']}" for f in findings)
    return proc, findings, described + proc.stderr[-1500:]


def _cause(mode: str, tmp_path, env: dict | None = None, job=JOB):
    proc, findings, described = _run(mode, tmp_path, env=env, job=job)
    assert proc.returncode != 0 and "stopping the job (--on-hang kill)" in proc.stderr, (
        described)
    errors = [f for f in findings if f["severity"] == "error"]
    assert len(errors) == 1, described  # one cause; the hangs it makes are folded in
    return errors[0], described


@pytest.mark.timeout(90)
def test_ranks_in_new_groups_barrier_for_non_members_that_skipped_it(tmp_path):
    """Only the pair calls new_group([0, 1]) (inside `if rank in tp_ranks`); with
    TORCH_DIST_INIT_BARRIER=1 torch ends it with a store barrier over all four ranks, keyed
    by the group's name, which ranks 2, 3 never write. The tracer's creation span has
    ended (the group is built), so before: a plain hang, "ranks 0, 1 never joined
    all_reduce ... in no collective"."""
    f, described = _cause("guarded", tmp_path, env=BARRIER)
    marks = marker_sets(JOB)
    d = f["details"]
    assert (f["kind"], d["reason"]) == ("hang", "group_creation_skipped"), described
    assert d["never_created"] == [2, 3] and d["in_barrier"] == [0, 1], d
    assert f["ranks"] == [0, 1], described  # the guarded call, as for a guarded collective
    assert d["branch"]["condition"] == "rank in tp_ranks", d
    assert {(c["rank"], c["line"]) for c in f["callsites"]} >= {
        (0, line) for line in marks["guarded"]}, f["callsites"]
    for words in ("rank 0 is in the store barrier at the end of new_group([0, 1])",
                  "TORCH_DIST_INIT_BARRIER=1", "members or not"):
        assert words in f["summary"], f["summary"]


@pytest.mark.timeout(90)
def test_members_gone_into_other_creations_around_a_ring_are_a_deadlock(tmp_path):
    """Pairs made by their members, each rank in an order of its own: each waits inside
    new_group for a member inside another. Before: no finding at all (no collective open,
    no name given apart), the job stopped only by the test's timeout."""
    f, described = _cause("ring", tmp_path)
    marks = marker_sets(JOB)
    d = f["details"]
    assert (f["kind"], d["reason"]) == ("deadlock", "group_creation_cycle"), described
    assert d["cycle"] == [0, 1, 2, 3] and f["ranks"] == [0, 1, 2, 3], d
    inside = {r: (x["members"], x["waits_for"]) for r, x in d["inside"].items()}
    assert inside == {"0": ([0, 1], [1]), "1": ([1, 2], [2]), "2": ([2, 3], [3]),
                      "3": ([0, 3], [0])}, inside
    assert {c["line"] for c in f["callsites"]} == marks["ring"], f["callsites"]
    assert "rank 1 is inside new_group([1, 2])" in f["summary"], f["summary"]


@pytest.mark.timeout(90)
def test_the_job_that_looks_like_them_says_only_who_held_the_creation(tmp_path):
    """The ring in orders that differ only between non-members, a member-only plain group
    without the barrier, and rank 2 computing 11 s before a new_group the others wait in:
    healthy. Before: no word of the wait (a collective's is said)."""
    proc, findings, described = _run("healthy", tmp_path, hang_timeout=None)
    assert proc.returncode == 0, described
    [f] = findings
    marks = marker_sets(JOB)
    assert (f["kind"], f["severity"], f["ranks"]) == ("long_wait", "info", [2]), described
    assert f["details"]["waiting_ranks"] == [0, 1, 3] and not f["details"]["in_flight"]
    assert {(c["rank"], c["line"]) for c in f["callsites"]} >= {
        (2, line) for line in marks["busy"]}, f["callsites"]


@pytest.mark.timeout(90)
@pytest.mark.skipif(not _numbers_member_named_groups(),
                    reason="this torch names plain groups by plain groups only: the same "
                    "names on every rank")
def test_non_members_that_name_a_plain_group_apart_hang_in_the_barrier(tmp_path):
    """torch 2.15, member_names.py nonmember (quiet without the barrier,
    test_counter_names): with TORCH_DIST_INIT_BARRIER=1 ranks 0, 1, no members of
    new_group([2, 3]), wait in its barrier on a name one apart from the members'. Before:
    no finding at all."""
    f, described = _cause("nonmember", tmp_path, env=BARRIER, job=MEMBER_NAMES_JOB)
    d = f["details"]
    assert (f["kind"], d["reason"]) == ("hang", "group_counter_names"), described
    assert d["members"] == [2, 3] and d["barrier"], d
    assert sorted(r for n in d["names"] for r in n["ranks"]) == [0, 1, 2, 3], d
    assert f["ranks"] == [0, 1], described  # their member-named pair raised their counter
    assert "no members of it" in f["summary"], f["summary"]
