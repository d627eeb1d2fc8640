"""Where torch tests `type(group) is ProcessGroup` (tracer/exact_class.py), a traced NCCL
group is treated as the plain one, traced and bare compared:

- batch_isend_irecv is coalesced as it is bare: one Work for the batch (ncclGroupStart/End
  around its ops), not one per op; issued op by op, two stages exchanging more than
  NCCL's buffer wait on each other's sends. On one GPU the rank exchanges with itself
  (isend/irecv allow it); on two, a ring. 64 MiB a send, over NCCL's 4 MiB buffer. The
  batch's ops are recorded at its line and complete with the batch's Work.
- destroy_process_group waits for the Works whose on-completion hooks are still to run."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from conftest import JOBS, marker_lines, run_cli, run_job, run_ranks_bare

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


def test_destroy_waits_for_the_completion_hooks_as_bare(tmp_path):
    job = str(Path(__file__).parent / "jobs" / "completion_hooks.py")
    bare = run_ranks_bare([sys.executable, job], dict(os.environ), 1, 120, "the bare hooks")
    bare = [json.loads(o.split("HOOKS ", 1)[1].splitlines()[0]) for o in bare]
    assert bare == [{"ran": 20, "ops": 20}], bare  # torch's wait, bare
    run_dir = tmp_path / "run"
    traced = run_cli(["run", "--nproc", "1", "--run-dir", str(run_dir), "--grace", "2", "--",
                      job], timeout=150, run_dir=run_dir)
    assert traced.returncode == 0, traced.stderr[-3000:]
    printed = [json.loads(line.split("HOOKS ", 1)[1]) for line in traced.stdout.splitlines()
               if "HOOKS " in line]
    assert printed == bare, traced.stdout[-2000:]
