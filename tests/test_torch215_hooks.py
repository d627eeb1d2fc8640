"""torch 2.15's ProcessGroup hooks see every op traced as bare, and every NCCL name torch
builds is traced (issue 51). In the version matrix's smoke set (tests/tiers.py).

Expectations, and the torch source each comes from (torch 2.15.0):
- pre/post hooks fire from the c10d dispatcher kernels, around every op, with the op's
  `Work` in the post hook and one op id per pre/post pair (`ProcessGroup.hpp`, `preHooks_`,
  `firePreHook`, `firePostHook`; `Hooks.hpp`);
- `TORCH_DIST_NAN_CHECK=1` attaches `NanCheckHook` to every group, which refuses a NaN
  input (`distributed_c10d.py`, `_new_process_group_helper`);
- "nccl2", "nccl-lazy", "nccl-legacy" are registered through the
  `torch.distributed.backends` entry points as `BackendType.CUSTOM`, "nccl" as NCCL
  (`distributed_c10d.py`, `_register_builtin_*_backend`); a barrier without a device
  runs on CUDA only for a group whose default backend type is NCCL (`ProcessGroup.hpp`,
  `ProcessGroup::barrier`).
"""

from __future__ import annotations

import json
import os
import sys

import pytest
import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from conftest import JOBS, run_job, run_ranks_bare

from distdoctor.tracer import backends
from distdoctor.tracer.process_group import backend_type, barrier_device_type

pytestmark = pytest.mark.timeout(120)
HOOKS = hasattr(dist.ProcessGroup, "register_pre_hook")
needs_hooks = pytest.mark.skipif(
    not HOOKS, reason=f"torch {torch.__version__} has no ProcessGroup pre/post hooks (2.14+)")


def _bare(job: str, *args: str, env: dict | None = None, timeout: float = 60) -> list[str]:
    """Two ranks launched torchrun-style without distdoctor; each rank's output."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("DISTDOCTOR")}
    full.update(env or {}, PYTHONUNBUFFERED="1")
    return run_ranks_bare([sys.executable, str(JOBS / job), *args], full, 2, timeout,
                          f"{job} bare")


def _counts(directory) -> dict[int, dict]:
    return {r: json.loads((directory / f"hooks-{r}.json").read_text()) for r in (0, 1)}


@needs_hooks
def test_hooks_fire_traced_as_bare_on_every_op_kind(tmp_path):
    bare_dir, traced_dir = tmp_path / "bare", tmp_path / "traced"
    bare_dir.mkdir()
    traced_dir.mkdir()
    _bare("hook_count.py", str(bare_dir))
    res = run_job("hook_count.py", 2, tmp_path / "run", str(traced_dir), timeout=90)
    assert res.returncode == 0, res.stderr
    bare, traced = _counts(bare_dir), _counts(traced_dir)
    for rank in (0, 1):
        assert traced[rank].pop("group") == "TracingProcessGroup"
        assert bare[rank].pop("group") == "ProcessGroup"
        b = bare[rank]
        # every kind the job issues reached the hooks bare (the job tests what it says),
        # under the name this torch gives it: 2.15 tells the coalesced and "_base" ops
        # apart; 2.14.1, whose hooks fire too, names them ALLREDUCE, ALLGATHER and
        # REDUCE_SCATTER (seen on it: the same 16 ops)
        kinds = set(b["pre"])
        for names in ({"ALLREDUCE"}, {"BARRIER"}, {"SEND"}, {"RECV"}, {"BROADCAST"},
                      {"ALLGATHER_BASE", "ALLGATHER"},
                      {"REDUCE_SCATTER_BASE", "REDUCE_SCATTER"}):
            assert names & kinds, (names, b["pre"])
        if "ALLGATHER_BASE" in kinds:  # (2.15's names)
            assert {"ALLREDUCE_COALESCED", "ALLGATHER_INTO_TENSOR_COALESCED"} <= kinds, kinds
        assert b["pre"] == b["post"] and b["pairs"] == b["post_work"] == sum(b["pre"].values())
        assert traced[rank] == b  # counts per op, works, op ids, gloo's own FR entries


@needs_hooks
def test_torchs_nan_check_hook_still_refuses_a_nan_when_traced(tmp_path):
    env = {"TORCH_DIST_NAN_CHECK": "1"}
    bare = _bare("nan_check.py", env=env)
    assert all("NAN-REFUSED" in out for out in bare), bare
    res = run_job("nan_check.py", 2, tmp_path / "run", timeout=90, env=env)
    assert res.stdout.count("NAN-REFUSED") == 2, res.stdout + res.stderr


def _names_torch_registers() -> set[str]:
    from importlib.metadata import entry_points

    return {e.name.lower() for e in entry_points(group="torch.distributed.backends")}


@pytest.mark.parametrize("name", ["nccl", "nccl2", "nccl-lazy", "nccl-legacy",
                                  "cpu:gloo,cuda:nccl2", "cpu:gloo,cuda:nccl"])
def test_every_nccl_name_torch_builds_is_traced(name):
    names = {part.split(":")[-1] for part in name.split(",")}
    if not names <= _names_torch_registers() | {"gloo", "nccl"}:
        pytest.skip(f"torch {torch.__version__} does not register {name}")
    assert backends.traced_backend(c10d, name)
    assert backends.traced_backend(c10d, "gloo")


def test_a_foreign_backend_stays_untraced():
    def create(*_args):  # a Python backend of someone else's, never built here
        raise AssertionError("not called")

    create.__module__ = "vendor_backend"
    dist.Backend.register_backend("dd_vendor", create, devices=["cpu"])
    assert not backends.traced_backend(c10d, "dd_vendor")
    assert not backends.traced_backend(c10d, "cpu:gloo,cuda:dd_vendor")


def test_barrier_device_and_type_follow_torchs_registration():
    types = dist.ProcessGroup.BackendType
    assert backend_type("gloo") == types.GLOO and backend_type("nccl") == types.NCCL
    assert backend_type("no-such-backend") == types.CUSTOM
    assert barrier_device_type(backend_type("nccl")) == "cuda"
    assert barrier_device_type(backend_type("gloo")) == "cpu"
    if "nccl2" in _names_torch_registers():  # CUSTOM, as ProcessGroup::barrier sees it
        backends.traced_backend(c10d, "nccl2")  # registers it, as torch does on first use
        assert backend_type("nccl2") == types.CUSTOM
        assert barrier_device_type(backend_type("nccl2")) == "cpu"
