"""Helpers of the GPU tier: its jobs, and where its measurements and recordings go.

benchmarks/gpu_suite.py sets DISTDOCTOR_GPU_RESULTS (a JSON-lines file its summary reads)
and DISTDOCTOR_GPU_FIXTURES (a folder that comes back from the GPU machine); run alone,
the tier keeps both in the test's tmp_path.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import conftest  # the root tests/conftest.py (tests/ is on sys.path while pytest runs)

JOBS = Path(__file__).parent / "jobs"
RESULTS_ENV = "DISTDOCTOR_GPU_RESULTS"
FIXTURES_ENV = "DISTDOCTOR_GPU_FIXTURES"


def marker_lines(job: str) -> dict[str, int]:
    """`# expect: NAME` comments in tests/gpu/jobs/JOB -> their line numbers."""
    return conftest.marker_lines(job, JOBS)


def printed_json(output: str, tag: str) -> list:
    """Every `TAG {json}` a job printed (ranks' lines may carry a prefix)."""
    out = []
    for line in output.splitlines():
        if f"{tag} " in line:
            out.append(json.loads(line.split(f"{tag} ", 1)[1]))
    return out


def note_measurement(test: str, **data) -> None:
    """Append a measurement for the suite's summary (nothing when run outside it)."""
    path = os.environ.get(RESULTS_ENV)
    if path:
        with open(path, "a") as fh:
            fh.write(json.dumps({"test": test, **data}) + "\n")


def fixtures_dir(fallback: Path) -> Path:
    """Where recorded NVML fixtures go: the suite's folder, else `fallback`."""
    path = Path(os.environ.get(FIXTURES_ENV) or fallback)
    path.mkdir(parents=True, exist_ok=True)
    return path


def slug(text: str) -> str:
    """A file-name-safe lower-case form of a GPU name: letters, digits and '-'."""
    return re.sub(r"[^a-z0-9]+", "-", text.lower().replace("nvidia", "")).strip("-") or "gpu"
