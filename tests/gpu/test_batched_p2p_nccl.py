"""batch_isend_irecv on NCCL under `distdoctor run` is coalesced as it is bare: one Work
for the batch (ncclGroupStart/End around its ops), not one per op. Since torch 2.7 torch
coalesces only a group whose type *is* ProcessGroup, and a traced group is a subclass:
its batches went out op by op, and two stages exchanging more than NCCL's buffer waited
on each other's sends (tracer/coalescing.py). On one GPU the rank exchanges with itself
(isend/irecv allow it); on two, a ring. 64 MiB a send, over NCCL's 4 MiB buffer.

Also: the batch's ops are recorded at its line and complete with the batch's Work."""

from __future__ import annotations

import json
import os
import sys

import pytest
from conftest import JOBS, marker_lines, run_job, run_ranks_bare

from distdoctor.runlog.run import read_run

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(240)]

JOB = "batched_p2p.py"


def batches(outputs: str) -> list[dict]:
    return sorted((json.loads(line.split("BATCH ", 1)[1]) for line in outputs.splitlines()
                   if "BATCH " in line), key=lambda b: b["rank"])


@pytest.mark.parametrize("world", [pytest.param(1, id="world1"),
                                   pytest.param(2, id="world2", marks=pytest.mark.gpu(2))])
def test_a_batch_is_one_coalesced_work_as_bare(world, tmp_path):
    bare = run_ranks_bare([sys.executable, str(JOBS / JOB), "nccl", "64"], dict(os.environ),
                          world, 120, "the bare batch")
    bare = batches("\n".join(bare))
    assert [b["rank"] for b in bare] == list(range(world)) and all(b["right"] for b in bare)
    run_dir = tmp_path / "run"
    traced = run_job(JOB, world, run_dir, "nccl", "64", timeout=150)
    assert traced.returncode == 0, traced.stderr[-3000:]
    assert batches(traced.stdout) == bare  # bare: {"works": 1, "right": true} on each rank
    line = marker_lines(JOB)["batch"]
    for rank, events in read_run(run_dir).events.items():
        ops = [e for e in events if e.callsite and e.callsite["line"] == line]
        assert sorted(e.op for e in ops) == ["recv", "send"], (rank, ops)
        assert all(e.status == "ok" and e.t_end_ns for e in ops), (rank, ops)
