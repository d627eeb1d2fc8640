"""Where torch tests `type(group) is ProcessGroup`, a traced group is treated as the plain
one (tracer/exact_class.py): batch_isend_irecv coalesces it, destroy_process_group waits
for its completion hooks. Only NCCL coalesces or runs such hooks, so both are compared on
a GPU (tests/gpu/test_exact_class_nccl.py); here: that the test torch makes is read right
on the torch installed, and that a gloo batch, which torch never coalesces, is untouched."""

from __future__ import annotations

import inspect
import os
import sys
import types

import pytest
import torch.distributed.distributed_c10d as c10d
from conftest import JOBS, marker_lines, run_job, run_ranks_bare

from distdoctor.runlog.run import read_run
from distdoctor.tracer.exact_class import closed_to_subclasses, patch_batch_isend_irecv


def test_the_class_test_is_read_from_the_installed_torchs_code():
    # the source says it in words; the detector reads the code's names: they must agree
    original = inspect.unwrap(c10d.batch_isend_irecv)
    says = "type(group) is ProcessGroup" in inspect.getsource(original)
    assert closed_to_subclasses(c10d.batch_isend_irecv) == says


def test_destroys_class_test_is_read_from_the_installed_torchs_code():
    original = inspect.unwrap(c10d.destroy_process_group)
    says = "type(pg) is ProcessGroup" in inspect.getsource(original)
    assert closed_to_subclasses(c10d.destroy_process_group, "_has_hooks") == says


def test_a_torch_that_coalesces_every_cuda_batch_is_left_as_it_is():
    # torch 2.4.0 distributed_c10d.py's test, which a traced group passes as it is
    def batch_isend_irecv(p2p_op_list):
        group = p2p_op_list[0].group
        device = p2p_op_list[0].tensor.device
        if device.type == "cuda":
            with _coalescing_manager(group, device, async_ops=True) as cm:  # noqa: F821
                pass
            return cm.works
        return []

    module = types.SimpleNamespace(batch_isend_irecv=batch_isend_irecv)
    assert not closed_to_subclasses(batch_isend_irecv)
    patch_batch_isend_irecv(module, object)
    assert module.batch_isend_irecv is batch_isend_irecv


def test_a_torch_whose_test_lets_subclasses_in_is_left_as_it_is():
    # the isinstance test proposed upstream (pytorch#178906): torch coalesces the traced
    # group itself, and a second coalescing around its own would break the batch
    def batch_isend_irecv(p2p_op_list):
        group = p2p_op_list[0].group
        device = p2p_op_list[0].tensor.device
        if isinstance(group, ProcessGroup) and group._get_backend(  # noqa: F821
                device).supports_coalescing:
            return []
        return list(p2p_op_list)

    module = types.SimpleNamespace(batch_isend_irecv=batch_isend_irecv)
    assert not closed_to_subclasses(batch_isend_irecv)
    patch_batch_isend_irecv(module, object)
    assert module.batch_isend_irecv is batch_isend_irecv


@pytest.mark.timeout(120)
def test_a_gloo_batch_is_issued_as_bare(tmp_path):
    run_dir = tmp_path / "run"
    traced = run_job("batched_p2p.py", 2, run_dir, "gloo", timeout=90)
    assert traced.returncode == 0, traced.stderr[-3000:]
    bare = run_ranks_bare([sys.executable, str(JOBS / "batched_p2p.py"), "gloo"],
                          dict(os.environ), 2, 90, "the bare batch")
    lines = sorted(line.split("BATCH ", 1)[1] for line in traced.stdout.splitlines()
                   if "BATCH " in line)
    assert lines == sorted(o.split("BATCH ", 1)[1].splitlines()[0] for o in bare), lines
    line = marker_lines("batched_p2p.py")["batch"]
    for rank, events in read_run(run_dir).events.items():
        batch = [e for e in events if e.callsite and e.callsite["line"] == line]
        assert sorted(e.op for e in batch) == ["recv", "send"], (rank, batch)
        assert all(e.status == "ok" and e.t_end_ns for e in batch), (rank, batch)
