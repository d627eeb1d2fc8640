"""The version matrix, wider than CI's: which distdoctor feature works on which torch.

For each virtual environment given (each with its own torch and this project installed
editable: `pip install torch==X` then `pip install -e ".[test]"`), runs the smoke set
(`pytest -m matrix`, tests/tiers.py) and the reference trainer's parallel modes, each
for 3 steps under `distdoctor run` (2 or 4 gloo ranks), and prints one Markdown table:
feature x torch -> works / n/a (this torch lacks it, with the trainer's own one line) /
FAIL. What docs/torch-versions.md's table shows.

    python benchmarks/torch_versions.py --venv .venv --venv /path/venv-torch2.4.1 ...
        [--json out.json] [--no-modes]

With no --venv: .venv and every .venv-torch* beside it (what .ci/run leaves).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

from distdoctor.reference_trainer.config import PARALLEL_MODES

ROOT = Path(__file__).resolve().parents[1]

# feature -> test id prefixes in the smoke set (all must pass; all skipped = n/a)
FEATURES = {
    "explicit ops: every family, its call site": ["test_tracer_ops.py::test_every_explicit",
                                                   "test_tracer_ops.py::test_p2p",
                                                   "test_tracer_ops.py::test_subgroup"],
    "DDP, DTensor, FSDP2*, pipelining* seen": ["test_tracer_ops.py::test_ddp_fsdp2"],
    "same sequence as the Flight Recorder (gloo)": ["test_tracer_ops.py::test_traced_sequence"],
    "ops under this release's names; floor line": ["test_torch_versions.py::"],
    "mismatch (shape)": ["test_diagnosis_corpus.py::test_bug_is_diagnosed[shape_mismatch]"],
    "hang (a rank outside the collective)":
        ["test_diagnosis_corpus.py::test_bug_is_diagnosed[stuck_outside]"],
    "deadlock (p2p)": ["test_diagnosis_corpus.py::test_bug_is_diagnosed[p2p_deadlock]"],
    "crash (a rank killed)": ["test_diagnosis_corpus.py::test_bug_is_diagnosed[oom_killed]"],
    "healthy job: no finding": ["test_diagnosis_corpus.py::test_healthy_job"],
    "straggler with its cause": ["test_stragglers.py::"],
    "diagnose --log (the log corpus)": ["test_log_diagnosis.py::test_corpus"],
    "demo": ["test_demo.py::"],
}

# row -> (ranks, flags): the trainer's modes on 2 or 4 ranks
MODES = {f"trainer: {name}": mode for name, mode in PARALLEL_MODES.items() if mode[0] <= 4}


def env_for(venv: Path) -> dict:
    env = dict(os.environ)
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env['PATH']}"
    env.pop("PYTHONPATH", None)
    return env


def torch_version(venv: Path) -> str:
    out = subprocess.run([str(venv / "bin" / "python"), "-c",
                          "import torch; print(torch.__version__)"],
                         capture_output=True, text=True, timeout=120)
    return out.stdout.strip() or f"? ({out.stderr.strip().splitlines()[-1:]})"


def smoke(venv: Path) -> dict[str, str]:
    """test id -> passed | failed | skipped."""
    with tempfile.TemporaryDirectory() as tmp:
        xml = Path(tmp) / "junit.xml"
        subprocess.run([str(venv / "bin" / "python"), "-m", "pytest", "-q", "-m", "matrix",
                        "-p", "no:cacheprovider", f"--junitxml={xml}"], cwd=ROOT,
                       env=env_for(venv), capture_output=True, timeout=1800)
        out = {}
        for case in ET.parse(xml).iter("testcase"):
            test_id = f"{case.get('classname').split('.')[-1]}.py::{case.get('name')}"
            status = "passed"
            if case.find("skipped") is not None:
                status = "skipped"
            elif case.find("failure") is not None or case.find("error") is not None:
                status = "failed"
            out[test_id] = status
        return out


def feature_cell(results: dict[str, str], prefixes: list[str]) -> str:
    hits = [s for t, s in results.items() if t.startswith(tuple(prefixes))]
    if not hits:
        return "?"
    if "failed" in hits:
        return f"FAIL ({hits.count('failed')}/{len(hits)})"
    return "n/a" if all(s == "skipped" for s in hits) else "works"


def mode_cell(venv: Path, flags: list[str], nproc: int) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [str(venv / "bin" / "python"), "-m", "distdoctor", "run", "--nproc", str(nproc),
               "--run-dir", f"{tmp}/run", "--", "python", "-m",
               "distdoctor.reference_trainer", *flags, "--steps", "3", "--batch-size", "8",
               "--timeout-s", "60"]
        try:
            res = subprocess.run(cmd, cwd=tmp, env=env_for(venv), capture_output=True,
                                 text=True, timeout=240)
        except subprocess.TimeoutExpired:
            return "FAIL (timed out)"
        text = res.stdout + res.stderr
        said = [line for line in text.splitlines() if "cannot run this layout" in line]
        if said:
            return "n/a: " + said[0].split("cannot run this layout: ", 1)[1].split(";")[0]
        if res.returncode == 0 and "step    3/3" in text and "no findings" in text:
            return "works"
        return f"FAIL (exit {res.returncode})"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", action="append", type=Path, default=[])
    parser.add_argument("--json", type=Path)
    parser.add_argument("--no-modes", action="store_true", help="the smoke set only")
    args = parser.parse_args()
    venvs = args.venv or [ROOT / ".venv", *sorted(ROOT.glob(".venv-torch*/"))]
    columns = {}
    for venv in venvs:
        version = torch_version(venv)
        print(f"torch {version} ({venv}) ...", file=sys.stderr, flush=True)
        results = smoke(venv)
        cells = {name: feature_cell(results, prefixes) for name, prefixes in FEATURES.items()}
        if not args.no_modes:
            for name, (nproc, flags) in MODES.items():
                cells[name] = mode_cell(venv, flags, nproc)
        columns[version] = cells
    order = sorted(columns, key=lambda v: tuple(int(p) for p in v.split("+")[0].split(".")[:2]))
    rows = [*FEATURES, *([] if args.no_modes else MODES)]
    print("| feature | " + " | ".join(order) + " |")
    print("|---|" + "---|" * len(order))
    for row in rows:
        print(f"| {row} | " + " | ".join(columns[v].get(row, "") for v in order) + " |")
    if args.json:
        args.json.write_text(json.dumps(columns, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
