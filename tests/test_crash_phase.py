"""The phase of a crash (issue 48, phase.py): "in step 12", "after the last step (step
8)", "before the first step", read from the program (tests/jobs/crashes/phase.py) and the
rank's ops. One real gloo job (an exception after the loop ended); the other phases on
the same program at the lines its runs recorded."""

from __future__ import annotations

import json
from collections import deque
from types import SimpleNamespace as NS

import pytest
from conftest import JOBS, marker_lines, run_cli

from distdoctor.diagnosis.crashes.phase import crash_phase
from distdoctor.diagnosis.parting import source as S

JOB = JOBS / "crashes" / "phase.py"
OP_LINE = next(n for n, t in enumerate(JOB.read_text().splitlines(), 1)
               if "dist.all_reduce(g)" in t)


def _ops(n: int) -> deque:
    return deque((NS(kind="collective", callsite={"file": str(JOB), "line": OP_LINE,
                                                  "function": "<module>"})
                  for _ in range(n)), maxlen=128)


def _ended(marker: str) -> dict:
    return {"file": str(JOB), "line": marker_lines("crashes/phase.py")[marker],
            "function": "<module>"}


def test_a_raise_in_the_loop_is_in_the_step_the_loop_counts():
    S.read.cache_clear()
    # 11 turns made their all_reduce; the raise comes before the 12th's
    assert crash_phase(_ended("raise"), _ops(11), None)["text"] == "in step 12"
    # the job's own span is its framework's count, said as it is
    assert crash_phase(_ended("raise"), _ops(11), "step 40")["text"] == "in step 40"
    # a history cut at its bound counts no turns: no number is made up
    cut = deque(_ops(128), maxlen=128)
    assert crash_phase(_ended("raise"), cut, None)["text"].startswith("in the loop at line")


def test_a_raise_after_the_loop_or_before_it_says_so():
    S.read.cache_clear()
    after = crash_phase(_ended("raise_after"), _ops(8), None)
    assert after["phase"] == "after_last_step" and after["text"] == \
        "after the last step (step 8)"
    # where the job's span is still the last step's, it is after that step, not in it
    assert crash_phase(_ended("raise_after"), _ops(20), "step 20")["text"] == \
        "after the last step (step 20)"
    # not in a loop of ops: nothing said rather than a guess
    assert crash_phase(_ended("raise_after"), deque(), None) is None


@pytest.mark.timeout(120)
def test_an_exception_after_the_loop_is_said_after_the_last_step(tmp_path):
    run_dir = tmp_path / "run"
    proc = run_cli(["run", "--nproc", "2", "--run-dir", str(run_dir), "--grace", "2",
                    "--on-hang", "kill", "--", str(JOB), "after_loop"],
                   timeout=100, run_dir=run_dir)
    assert proc.returncode != 0
    findings = json.loads((run_dir / "findings.json").read_text())["findings"]
    crash = next(f for f in findings if f["kind"] == "crash" and f["severity"] == "error")
    assert crash["ranks"] == [1], [f["summary"] for f in findings]
    assert "after the last step (step 8)" in crash["summary"], crash["summary"]
    assert crash["details"]["phase"]["phase"] == "after_last_step"
    assert "in step" not in crash["summary"]
    line = marker_lines("crashes/phase.py")["raise_after"]
    assert any(c["rank"] == 1 and c["line"] == line for c in crash["callsites"])
