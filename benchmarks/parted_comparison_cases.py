"""The parted-ways corpus's cases (tests/jobs/parted/, manifest in CASES.md) as
benchmarks/parted_comparison.py runs and scores them: each job at its rank counts, what it
is, the culprit ranks a right answer names ("tie", "threads", or None for a healthy job),
which `# expect:` lines count as the line where the ranks parted, and the public thread
its class comes from."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT / "tests") not in sys.path:  # (parted_comparison.py puts it first already)
    sys.path.append(str(ROOT / "tests"))
from conftest import marker_sets  # noqa: E402  (the tests' reading of `# expect:` lines)

PARTED = ROOT / "tests" / "jobs" / "parted"

# where each class comes from (public threads, 2024-2026; see CASES.md)
SRC = {
    "stray": "https://github.com/ray-project/ray/issues/56997",
    "metric": "https://github.com/Lightning-AI/torchmetrics/issues/2758",
    "threads": "https://github.com/KempnerInstitute/KempnerForge/issues/104",
    "resume": "https://github.com/KempnerInstitute/KempnerForge/pull/50",
    "nan_skip": "https://github.com/pytorch/audio/issues/3749",
    "tie": "https://github.com/NVIDIA-NeMo/Speech/pull/14380",
    "p2p_unmatched": "https://github.com/NVIDIA/nccl/issues/2130",
    "p2p_lists": "https://github.com/pytorch/torchtitan/issues/775",
    "wrong_peer": "https://github.com/pytorch/pytorch/issues/172668",
    "healthy_bcast": "https://github.com/KempnerInstitute/KempnerForge/pull/50",
    "healthy_pp": "https://github.com/pytorch/PiPPy/pull/1000",
    "healthy_thread": "https://github.com/KempnerInstitute/KempnerForge/pull/105",
    "healthy_helper": "https://github.com/ray-project/ray/pull/65838",
}


@dataclass
class Case:
    job: str
    nproc: int
    what: str
    culprits: tuple[int, ...] | str | None  # ranks | "tie" | "threads" | None (healthy)
    markers: tuple[str, ...]  # which `# expect:` lines count as the parted line
    source: str


def _cases() -> dict[str, Case]:
    out: dict[str, Case] = {}

    def add(job, ranks, what, culprits, markers, source):
        for n in ranks:
            c = culprits(n) if callable(culprits) else culprits
            out[f"{job}@{n}"] = Case(job, n, what, c, markers, SRC[source])

    add("stray_barrier_helper", (2, 4), "stray barrier in a rank-0-only helper", (0,),
        ("parted", "caller"), "stray")
    add("stray_barrier_same_helper", (2, 4), "same helper, rank-0-only caller", (0,),
        ("parted", "caller"), "stray")
    add("rank0_metric_compute", (2, 4), "rank-0-only metric compute (control)", (0,),
        ("parted", "caller"), "metric")
    add("two_threads_one_group", (2, 4), "two threads on one group", "threads",
        ("parted",), "threads")
    add("resume_branch_2rank", (2, 4), "resume branch skipped on one node",
        lambda n: (1,) if n == 2 else (2, 3), ("parted",), "resume")
    add("nan_skip_2rank", (2,), "a NaN step's tail skipped on one rank", (1,), ("parted",),
        "nan_skip")
    add("tie_setup_branch_2rank", (2,), "branch at the first op, no evidence", "tie",
        ("tie_a", "tie_b"), "tie")
    add("batched_p2p_unmatched", (2,), "batched p2p: recv without a send", (1,),
        ("parted", "went_on"), "p2p_unmatched")
    add("batched_p2p_lists_disagree", (2, 4), "batched p2p: list sizes differ",
        lambda n: (n - 1,), ("parted", "went_on"), "p2p_lists")
    add("wrong_peer", (4,), "p2p to the wrong peer", (0,), ("parted",), "wrong_peer")
    add("hazard_thread_turns_same_group", (2,), "healthy hazard: threads take turns on one group",
        None, (), "threads")
    add("healthy_rank0_broadcast_branch", (2, 4), "healthy: rank-0 broadcast branch", None,
        (), "healthy_bcast")
    add("healthy_pipeline_lines", (2, 4), "healthy: pipeline stages' own lines", None, (),
        "healthy_pp")
    add("healthy_thread_separate_group", (2, 4), "healthy: thread with its own group", None,
        (), "healthy_thread")
    add("healthy_barrier_helper_all_ranks", (2, 4), "healthy: barrier helper on all ranks",
        None, (), "healthy_helper")
    return out


CASES = _cases()


def markers(job: str) -> dict[str, set[int]]:
    return marker_sets(PARTED / f"{job}.py")
