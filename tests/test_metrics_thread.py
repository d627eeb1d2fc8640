"""A healthy metrics thread is no straggler (issue 48, Why 7): a background thread
all-reduces metrics on a process group of its own (new_group on every rank, the right
way) at its own cadence per rank (every 30 ms on rank 0, 120 ms on rank 1), while the main
thread trains with all_reduce on the default group, on a machine kept busy by a spinning
process beside it (tests/jobs/stragglers/metrics_thread_own_group.py).

The thread's all_reduce waits ~90 ms a round for rank 1's slower cadence. Counted as step
lateness, it read as "host: node vm is busy — rank 1 kept the others waiting 56-59 ms per
step, its work slower at every line" (live and post-mortem, 2 of 2 runs before the
change), or once as a straggler that "delays rank 0 (undefined, 49 ms per step)". Neither
the live run nor the post-mortem may say so now (1-3 ms per step is left: the machine),
and no summary says a word of code for a missing value."""

from __future__ import annotations

import json
import re

import pytest
from conftest import JOBS, marker_lines, run_cli, run_job
from hogs import cpu_hogs

JOB = JOBS / "stragglers" / "metrics_thread_own_group.py"
# the thread's wait per round is ~90 ms, a round every other step: counted, rank 1 kept
# the others waiting 56-59 ms per step; the machine's own noise on this job's steps
# (one spinning process on two cores) stays far below this
THREAD_SIZED_MS = 30.0


def _said(findings) -> str:
    return "\n".join(f"{f['kind']} {f['severity']} {f['ranks']} {f['summary']}"
                     for f in findings)


def _no_thread_lateness(findings) -> None:
    said = _said(findings)
    assert not [f for f in findings if f["kind"] == "straggler"], said
    for f in findings:
        if f["kind"] == "host":  # a busy machine may be said; the thread's wait may not
            late = f["details"].get("lateness_ms_per_step") or {}
            assert all(ms < THREAD_SIZED_MS for ms in late.values()), said
    assert not re.search(r"\bundefined\b|\bNone\b", said), said


@pytest.mark.timeout(120)
def test_a_metrics_thread_on_its_own_group_is_no_straggler(tmp_path):
    run_dir = tmp_path / "run"
    with cpu_hogs(["any"], name="ddmetricshog"):
        proc = run_cli(["run", "--nproc", "2", "--run-dir", str(run_dir), "--grace", "2",
                        "--", str(JOB), "80", "30,120", "60"], timeout=90, run_dir=run_dir)
    assert proc.returncode == 0, proc.stderr[-2000:]
    live = json.loads((run_dir / "findings.json").read_text())["findings"]
    _no_thread_lateness(live)
    post = run_cli(["diagnose", str(run_dir), "--json"], timeout=60)
    _no_thread_lateness(json.loads(post.stdout)["findings"])


def _run(tmp_path, *flags) -> list[dict]:
    """The job on 2 ranks, 80 steps, the thread every 30 ms on rank 0, 120 ms on rank 1."""
    run_dir = tmp_path / "run"
    res = run_job("stragglers/metrics_thread_own_group.py", 2, run_dir, "80", "30,120",
                  "60", *flags, timeout=90)
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads((run_dir / "findings.json").read_text())["findings"]


@pytest.mark.timeout(120)
def test_a_straggler_beside_a_metrics_thread_is_found_in_the_steps_of_its_loop(tmp_path):
    """Step detection follows the step thread (beside.py, steptime.py): with no optimizer
    (no implicit spans) the steps are the turns of the main thread's collectives, which
    the thread's interleave with. Before, they broke its pattern: 7-8 steps of 64
    collectives in 80, and rank 1, 40 ms slower per step in extra_work, was never found.
    Now it is, as without the thread (58 steps, 40 ms per step over 57 of them)."""
    findings = _run(tmp_path, "manual", "slow=1")
    stragglers = [f for f in findings if f["kind"] == "straggler"]
    assert [f["ranks"] for f in stragglers] == [[1]], _said(findings)
    d = stragglers[0]["details"]
    assert d["cause"] == "compute" and d["steps"] >= 40, stragglers[0]["summary"]
    assert 30 <= d["step_lateness_ms"] <= 55, stragglers[0]["summary"]
    assert set(d["groups"]) == {"0"}, d["groups"]  # the training's: none of the thread's
    top = d["top_frames"][0]
    slow_line = marker_lines("stragglers/metrics_thread_own_group.py")["slow_line"]
    assert (top["function"], top["line"]) == ("extra_work", slow_line), d["top_frames"]
    assert not [f for f in findings if f["kind"] not in ("straggler", "host")], _said(findings)


@pytest.mark.timeout(120)
def test_a_thread_on_the_default_group_beside_training_on_a_subgroup_is_healthy(tmp_path):
    """The thread all-reduces on the default group, training on a group of all ranks of its
    own: each group is used by one thread, so its order is defined (torch's rule; two
    threads on one group is the bug mismatches/threads.py says). The step thread is the
    main thread, whichever group it uses; the thread's waits are no step's. No finding
    of the program (the machine's load may be said, not sized like the thread's wait)."""
    findings = _run(tmp_path, "manual", "swap")
    _no_thread_lateness(findings)
    assert not [f for f in findings if f["kind"] != "host"], _said(findings)
