"""The public corpus's fast subset (tests/jobs/corpus/: r08, r20, r23, h18, copied from
the shared corpus with its checkers) under benchmarks/public_corpus.py, as CI runs it:
distdoctor beside a plain timeout on one case, the table rendered from what both said.
The whole comparison (every case, every tool) is in docs/benchmarks.md."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "tests" / "jobs" / "corpus"


@pytest.mark.timeout(240)
def test_the_benchmark_scores_distdoctor_and_a_plain_timeout_on_a_corpus_case(tmp_path):
    out = tmp_path / "out.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "public_corpus.py"), "--corpus",
         str(CORPUS), "--cases", "r08", "--tools", "distdoctor,timeout", "--out", str(out)],
        capture_output=True, text=True, timeout=220, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| distdoctor (run, no hang timeout) | 1/1 | 1/1 | 1/1 |" in proc.stdout, proc.stdout
    # torch's own error names who printed it, not who strayed: no culprit
    assert "| plain timeout (torch's own error) | 0/1 |" in proc.stdout, proc.stdout
    assert out.exists()


def test_an_unknown_case_or_tool_is_one_line_and_a_usage_error():
    for args in (["--cases", "r99"], ["--tools", "gdb"]):
        proc = subprocess.run(
            [sys.executable, str(ROOT / "benchmarks" / "public_corpus.py"), "--corpus",
             str(CORPUS), *args], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
