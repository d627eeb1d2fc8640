"""benchmarks/gpu_suite.py without a GPU (CI): the plan, the dry run of the GPU tier,
its skip reason, and how a summary turns into an exit code. Not a GPU test.

The dry run of the tier is the real thing: pytest on tests/gpu in a child, CUDA hidden,
every GPU test reported skipped with its reason and none passed. The other stages (the
CPU overhead benchmarks, ~2.5 minutes even at the tiny size on 2 cores) are too long for
CI; `--cpu-only --stage all` runs them by hand (README)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SUITE = ROOT / "benchmarks" / "gpu_suite.py"
CPU_TESTS = {"test_suite_plumbing", "test_nvml_recorded_replay"}  # not `gpu`: run in CI
OWN_STAGE = {"test_torch215_nccl": "torch215"}  # GPU tests run by a stage of their own


def suite(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SUITE), *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, stdin=subprocess.DEVNULL)


def test_the_plan_splits_the_suite_into_stages_of_one_command_each():
    plan = json.loads(suite("--plan").stdout)
    assert list(plan["stages"]) == ["tests", "steps-a", "steps-b", "paired", "torch215"]
    assert plan["size"] == "full" and plan["budget_s"] < 600  # the device tool's limit
    tiny = json.loads(suite("--plan", "--cpu-only", "--stage", "steps-b,paired").stdout)
    assert list(tiny["stages"]) == ["steps-b", "paired"] and tiny["size"] == "tiny"
    bad = suite("--stage", "gpu", "--out", "/nonexistent")
    assert bad.returncode == 2 and "unknown stage 'gpu'" in bad.stderr
    assert "Traceback" not in bad.stderr


@pytest.mark.timeout(90)
def test_dry_run_reports_every_gpu_test_skipped_with_the_reason(tmp_path):
    proc = suite("--cpu-only", "--stage", "tests", "--out", str(tmp_path), timeout=80)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    summary = json.loads((tmp_path / "summary.json").read_text())
    (stage,) = summary["stages"]
    assert stage["name"] == "tests" and stage["status"] == "skipped", stage
    assert "CUDA" in stage["cuda_skipped"] and stage["reason"].startswith("GPU tier:"), stage
    tests = stage["tests"]
    assert tests and {t["outcome"] for t in tests} == {"skipped"}, tests
    assert all(t["message"].startswith("GPU tier:") for t in tests), tests
    gpu_modules = ({p.stem for p in (ROOT / "tests" / "gpu").glob("test_*.py")} - CPU_TESTS
                   - set(OWN_STAGE))
    assert {t["id"].split("::")[0] for t in tests} == gpu_modules  # none unmarked or lost
    assert summary["exit_code"] == 0 and summary["goals"] == []
    md = (tmp_path / "summary.md").read_text()
    assert "| tests | skipped |" in md and "passed" not in md
    files = [p.name for p in tmp_path.iterdir()]
    assert len(files) <= 8 and all(re.fullmatch(r"[A-Za-z0-9._-]+", f) for f in files), files


def test_skipped_gpu_parts_are_never_a_pass():
    sys.path.insert(0, str(SUITE.parent))
    try:
        import gpu_suite_report as report
    finally:
        sys.path.remove(str(SUITE.parent))
    skipped = [{"name": "tests", "status": "skipped"}]
    assert report.exit_code(skipped, cpu_only=False) == 3
    assert report.exit_code(skipped, cpu_only=True) == 0
    assert report.exit_code([*skipped, {"name": "paired", "status": "timeout"}], True) == 1
    paired = {"name": "paired", "ratio_median": 1.01, "ratio_q1": 1.0, "ratio_q3": 1.02}
    few = report.goals({"cpus": 2}, [paired], "full")[0]
    many = report.goals({"cpus": 16}, [paired], "full")[0]
    assert few["verdict"] == "undecided" and "2 cores for 2 ranks" in few["why"]
    assert many["verdict"] == "met"
    assert report.goals({"cpus": 16}, [paired], "tiny")[0]["verdict"] == "undecided"


@pytest.mark.timeout(90)
def test_the_torch215_stage_runs_its_own_gpu_test_and_skips_it_here_with_the_reason(tmp_path):
    proc = suite("--cpu-only", "--stage", "torch215", "--out", str(tmp_path), timeout=80)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (stage,) = json.loads((tmp_path / "summary.json").read_text())["stages"]
    assert stage["name"] == "torch215" and stage["status"] == "skipped", stage
    assert "CUDA" in stage["cuda_skipped"] and stage["reason"].startswith("GPU tier:"), stage
    tests = stage["tests"]
    assert {t["id"].split("::")[0] for t in tests} == {"test_torch215_nccl"}, tests
    assert len(tests) == 3 and {t["outcome"] for t in tests} == {"skipped"}, tests
    assert all(t["message"].startswith("GPU tier:") for t in tests), tests
