"""Where the ranks parted (issue 33): real gloo jobs (tests/jobs/parted/, each modelled on a
public bug report: CASES.md there) under `distdoctor run`. The finding names the culprit
and the line where its path parted from the others', not the later op where the
disagreement showed; two threads on one group are said as that race; with no majority the
evidence decides or the finding says it is a tie; p2p in words that say what each side
did. Healthy look-alikes get no error or warning. The reasoning itself (alignment, the
evidence) is unit-tested below on events built by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import JOBS, marker_sets, run_cli

from distdoctor.diagnosis.parting import align as D
from distdoctor.diagnosis.parting import blame
from distdoctor.runlog.reader import Event

PARTED = JOBS / "parted"


def _markers(job: str) -> dict[str, set[int]]:
    return marker_sets(PARTED / f"{job}.py")


def _run(job: str, nproc: int, run_dir: Path):
    proc = run_cli(["run", "--nproc", str(nproc), "--run-dir", str(run_dir), "--grace", "2",
                    "--on-hang", "kill", "--", str(PARTED / f"{job}.py")],
                   timeout=100, run_dir=run_dir)
    findings = json.loads((run_dir / "findings.json").read_text())["findings"]
    return proc, findings


def _said(findings) -> str:
    return "\n".join(f"{f['kind']} {f['severity']} {f['ranks']} {f['summary']}"
                     for f in findings)


# (job, ranks) -> (kind, culprits, the marker of the culprit's line where it parted)
CASES = {
    ("stray_barrier_helper", 2): ("mismatch", [0], "parted"),
    # (4 ranks: test_a_stray_barrier_is_named_where_it_was_issued_not_where_it_showed)
    ("stray_barrier_same_helper", 4): ("mismatch", [0], "parted"),
    ("resume_branch_2rank", 2): ("mismatch", [1], "parted"),
    ("resume_branch_2rank", 4): ("mismatch", [2, 3], "parted"),  # an even split
    ("nan_skip_2rank", 2): ("mismatch", [1], "parted"),  # an iteration ahead, earlier line
    ("rank0_metric_compute", 2): ("mismatch", [0], "parted"),
    ("batched_p2p_unmatched", 2): ("hang", [1], "parted"),
    ("batched_p2p_lists_disagree", 4): ("hang", [3], "parted"),
    ("wrong_peer", 4): ("deadlock", [0], "parted"),
}


@pytest.mark.timeout(150)
@pytest.mark.parametrize("job,nproc", sorted(CASES), ids=[f"{j}-{n}" for j, n in sorted(CASES)])
def test_the_culprit_and_the_line_where_it_parted(job, nproc, tmp_path):
    kind, culprits, marker = CASES[(job, nproc)]
    proc, findings = _run(job, nproc, tmp_path / "run")
    assert proc.returncode != 0
    errors = [f for f in findings if f["severity"] == "error"]
    assert errors and errors[0]["kind"] == kind, _said(findings)
    f = errors[0]
    assert f["ranks"] == culprits, _said(findings)
    lines = {c["line"] for c in f["callsites"] if c["rank"] in culprits}
    assert lines & _markers(job)[marker], (f["callsites"], _said(findings))
    # one finding per root cause: nothing else of severity error blames another rank
    assert all(set(g["ranks"]) <= set(culprits) for g in errors), _said(findings)
    if "caller" in _markers(job):  # the line that called the helper, too
        assert lines & _markers(job)["caller"], f["callsites"]
    if f["kind"] == "mismatch" and marker == "parted":
        parted = f["details"]["parted_at"]
        assert parted["culprit"]["rank"] == culprits[0]


@pytest.mark.timeout(150)
def test_a_stray_barrier_is_named_where_it_was_issued_not_where_it_showed(tmp_path):
    """The barrier inside the rank-0-only helper pairs with the others' end-of-step
    barrier; the disagreement shows one op later. The post-mortem says the same."""
    run_dir = tmp_path / "run"
    _, findings = _run("stray_barrier_helper", 4, run_dir)
    f = next(f for f in findings if f["severity"] == "error")
    assert f["kind"] == "mismatch" and f["ranks"] == [0], _said(findings)
    assert {c["line"] for c in f["callsites"] if c["rank"] == 0} & \
        _markers("stray_barrier_helper")["caller"]
    parted = f["details"]["parted_at"]
    assert parted["how"] == "extra" and parted["culprit"]["seq"] < f["seq"], parted
    assert parted["culprit"]["callsite"]["line"] in _markers("stray_barrier_helper")["parted"]
    again = run_cli(["diagnose", str(run_dir), "--json"], timeout=60)
    post = json.loads(again.stdout)["findings"]
    g = next(g for g in post if g["severity"] == "error")
    assert g["details"]["parted_at"]["culprit"]["seq"] == parted["culprit"]["seq"]
    assert g["ranks"] == [0]


@pytest.mark.timeout(150)
def test_two_threads_on_one_group_are_said_as_that_race(tmp_path):
    """2 ranks: no majority either, so a vote would blame whichever rank is odd
    (benchmarks/parted_comparison.py runs 4 as well)."""
    _, findings = _run("two_threads_one_group", 2, tmp_path / "run")
    errors = [f for f in findings if f["severity"] == "error"
              and f["kind"] in ("mismatch", "hang", "deadlock")]
    assert errors, _said(findings)
    f = errors[0]
    assert f["details"].get("reason") == "threads_share_group", _said(findings)
    assert "metrics-reporter" in f["summary"] and "main thread" in f["summary"]
    assert "order of collectives across threads is not defined" in f["summary"]
    assert "rank-dependent" not in (f["remedy"] or "")
    lines = {c["line"] for c in f["callsites"]}
    marks = _markers("two_threads_one_group")
    assert lines & marks["parted"] and lines & marks["other"], f["callsites"]
    # the hazard said once, as the failure: no separate info finding beside it
    assert not [g for g in findings if g["severity"] == "info"
                and g["details"].get("reason") == "threads_share_group"]


@pytest.mark.timeout(150)
def test_a_tie_blames_nobody_and_shows_both_lines(tmp_path):
    _, findings = _run("tie_setup_branch_2rank", 2, tmp_path / "run")
    f = next(f for f in findings if f["severity"] == "error")
    assert f["kind"] == "mismatch" and f["ranks"] == [], _said(findings)
    assert "tie" in f["summary"] and f["details"]["tie"] == [0, 1]
    by_rank = {(c["rank"], c["line"]) for c in f["callsites"]}
    marks = _markers("tie_setup_branch_2rank")
    assert by_rank & {(0, line) for line in marks["tie_a"]}, f["callsites"]
    assert by_rank & {(1, line) for line in marks["tie_b"]}, f["callsites"]


@pytest.mark.timeout(150)
@pytest.mark.parametrize("job,nproc", [("healthy_rank0_broadcast_branch", 4),
                                       ("healthy_pipeline_lines", 4),
                                       ("healthy_thread_separate_group", 2),
                                       ("healthy_barrier_helper_all_ranks", 2)])
def test_healthy_look_alikes_are_quiet(job, nproc, tmp_path):
    proc, findings = _run(job, nproc, tmp_path / "run")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [f for f in findings if f["severity"] in ("error", "warning")] == [], \
        _said(findings)


# --- the reasoning, on events built by hand ------------------------------------------

def _ev(rank, seq, op, line, callers=(), group="0", numel=8):
    site = {"file": "/job/train.py", "line": line, "function": "f"}
    if callers:
        site["callers"] = [{"file": "/job/train.py", "line": c, "function": "<module>"}
                           for c in callers]
    return Event(rank=rank, index=seq, kind="collective", op=op, status="ok", group=group,
                 group_desc="", group_ranks=(0, 1), seq=seq, peer=None, shapes=((numel,),),
                 dtypes=("float32",), device="cpu", numel_in=numel, numel_out=numel,
                 reduce_op="sum" if op == "all_reduce" else None, callsite=site,
                 t_enter_ns=seq, t_end_ns=seq + 1, span_index=0, name=None, error=None,
                 is_async=False, other_thread=False)


def test_an_extra_op_is_the_parting_not_the_op_that_disagrees():
    ours = [_ev(0, 0, "all_reduce", 10), _ev(0, 1, "barrier", 20, [30]),
            _ev(0, 2, "barrier", 31)]
    theirs = [_ev(1, 0, "all_reduce", 10), _ev(1, 1, "barrier", 31),
              _ev(1, 2, "all_reduce", 10)]
    p = D.parting(ours, theirs)
    assert p.how == "extra" and p.ours.seq == 1 and p.ours.callsite["line"] == 20


def test_one_op_from_two_lines_that_line_up_again_is_no_parting():
    # rank 0 broadcasts from its branch, the others receive at another line, then the
    # same again: no parting until the last op, which really differs
    ours = [_ev(0, 0, "broadcast", 5), _ev(0, 1, "all_reduce", 10),
            _ev(0, 2, "all_gather", 12)]
    theirs = [_ev(1, 0, "broadcast", 7), _ev(1, 1, "all_reduce", 10),
              _ev(1, 2, "all_reduce", 14)]
    p = D.parting(ours, theirs)
    assert p.how == "differ" and p.ours.seq == 2


def test_sequences_that_line_up_have_no_parting():
    ours = [_ev(0, s, "all_reduce", 10) for s in range(5)]
    theirs = [_ev(1, s, "all_reduce", 11) for s in range(5)]  # another line, every time
    assert D.parting(ours, theirs) is None


def test_the_rank_that_broke_the_jobs_rhythm_strayed(tmp_path):
    """Steps of all_reduce (line 10) then all_gather (line 12); at the fourth rank 1 left
    the all_gather out: it is at line 10 of the next step while rank 0 is at line 12. The
    later line is not further along here (both lie in one loop, which has come round);
    the rhythm of the steps before says who strayed, and that it skipped."""
    src = tmp_path / "train.py"
    src.write_text("\n" * 8 + "for step in range(9):\n" + "    pass\n" * 5)
    step = [("all_reduce", 10), ("all_gather", 12)]
    ours = [_ev(0, s, *step[s % 2]) for s in range(8)]
    theirs = [_ev(1, s, *step[s % 2]) for s in range(7)] + [_ev(1, 7, "all_reduce", 10)]
    for ev in ours + theirs:
        ev.callsite = {**ev.callsite, "file": str(src)}
    p = D.parting(ours, theirs)
    assert p.how == "differ" and p.ours.seq == 7
    history = {0: ours, 1: theirs}
    assert D.fits(p.ours, ours[:7], [ours[:7], theirs[:7]]) is True
    assert D.fits(p.theirs, theirs[:7], [ours[:7], theirs[:7]]) is False
    verdict = blame.judge(p, 0, 1, history, majority=False)
    assert verdict.branch is None  # the loop's body holds no branch: the rhythm tells
    assert (verdict.side, verdict.skipped) == (1, True), verdict.why
    assert D.rhythm([], [ours]) is None  # nothing before: no rhythm to break


@pytest.mark.timeout(150)
def test_a_group_two_threads_take_turns_on_is_a_hazard_said_once(tmp_path):
    """Healthy (the threads hand over in lock-step), but one hand-off away from a race:
    one info finding naming both threads' lines, nothing of warning or error."""
    job = "hazard_thread_turns_same_group"
    proc, findings = _run(job, 2, tmp_path / "run")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [f for f in findings if f["severity"] != "info"] == [], _said(findings)
    hazard = [f for f in findings if f["details"].get("reason") == "threads_share_group"]
    assert len(hazard) == 1, _said(findings)
    lines = {c["line"] for c in hazard[0]["callsites"]}
    marks = _markers(job)
    assert lines & marks["thread"] and lines & marks["main"], hazard[0]["callsites"]
    assert "loss-logger" in hazard[0]["summary"]
