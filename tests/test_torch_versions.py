"""Every torch from the floor to the newest: ops found under the names each release binds,
a torch below the floor left untraced with one line, and the run saying what it traces.

The version matrix itself (the smoke set on torch 2.4 and the newest release) runs these
and the tests marked `matrix` in other virtual environments: .ci/run and
benchmarks/torch_versions.py."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import torch
import torch.distributed as dist

from distdoctor.check.rules import _versions
from distdoctor.tracer import support
from distdoctor.tracer.ops import ABSENT_OPS, SPECS, TRACED_OPS, resolve


def test_each_op_is_found_under_the_name_this_release_binds():
    class Old:  # torch 2.4's ProcessGroup: the "single" ops under their old names only
        allreduce = _allgather_base = _reduce_scatter_base = alltoall_base = None
        allgather_into_tensor_coalesced = reduce_scatter_tensor_coalesced = None

    found, absent = resolve(Old)
    names = {spec.op: spec.method for spec in found}
    assert names == {
        "all_reduce": "allreduce",
        "all_gather_into_tensor": "_allgather_base",
        "reduce_scatter_tensor": "_reduce_scatter_base",
        "all_to_all_single": "alltoall_base",
        "all_gather_into_tensor_coalesced": "allgather_into_tensor_coalesced",
        "reduce_scatter_tensor_coalesced": "reduce_scatter_tensor_coalesced",
    }
    assert "broadcast" in {spec.op for spec in absent}
    # where both names exist (torch >= 2.13), the new one is wrapped and the old alias,
    # which forwards to it in C++, is not: every op is recorded once
    found, _ = resolve(dist.ProcessGroup)
    methods = [spec.method for spec in found]
    assert len(methods) == len(set(methods))
    if hasattr(dist.ProcessGroup, "all_gather_single"):
        assert "_allgather_base" not in methods


def test_every_spec_is_traced_or_absent_on_the_running_torch():
    assert set(TRACED_OPS) | set(ABSENT_OPS) == {spec.op for spec in SPECS}
    assert support.untraceable_ops() == []  # nothing torch.distributed offers is lost here


def test_the_floor_is_read_from_any_version_string():
    assert support.parse_version("2.6.0+cu124") == (2, 6)
    assert support.parse_version("2.15.0a0+git1234") == (2, 15)
    assert support.parse_version("nonsense") is None
    assert support.below_floor("2.4.1") is None and support.below_floor("2.13.0+cpu") is None
    assert "older than the oldest torch distdoctor supports (2.4)" in support.below_floor("2.3.1")
    assert support.below_floor("garbage") is None  # nothing assumed: ops are still looked up


def test_check_warns_of_a_torch_below_the_floor():
    row = next(r for r in _versions([{"rank": 0, "host": "n0",
                                      "versions": {"torch": "2.3.1"}}]) if "torch" in r.check)
    assert row.status == "warn" and "untraced" in row.found
    row = next(r for r in _versions([{"rank": 0, "host": "n0",
                                      "versions": {"torch": torch.__version__}}])
               if "torch" in r.check)
    assert row.status == "ok"


def _one_rank(tmp_path, prelude: str) -> subprocess.CompletedProcess:
    """A one-rank gloo job with the tracer installed after `prelude`.

    It meets itself through a TCP store on a port of its own choosing (what torchrun
    uses), and dumps its stacks and exits if it is still running after 60 s, so that a
    hang on some torch of the matrix fails with where it stood instead of a bare timeout."""
    script = textwrap.dedent(f"""
        import datetime, faulthandler
        faulthandler.dump_traceback_later(60, exit=True)
        import torch
        {prelude}
        import distdoctor
        distdoctor.install(run_dir={str(tmp_path / "run")!r})
        import torch.distributed as dist
        store = dist.TCPStore("127.0.0.1", 0, world_size=1, is_master=True,
                              timeout=datetime.timedelta(seconds=30))
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
        dist.all_reduce(torch.ones(2))
        print("group", type(dist.group.WORLD).__name__)
        dist.destroy_process_group()
    """)
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=90)


def test_a_torch_below_the_floor_runs_untraced_with_one_line(tmp_path):
    res = _one_rank(tmp_path, 'torch.__version__ = "2.3.1"')
    assert res.returncode == 0, res.stderr
    assert "group ProcessGroup" in res.stdout  # torch's own group: untouched
    lines = [line for line in res.stderr.splitlines() if "distdoctor" in line]
    assert lines == ["distdoctor: torch 2.3.1 is older than the oldest torch distdoctor "
                     "supports (2.4); this job runs untraced"]
    assert "Traceback" not in res.stderr


def test_the_rank_metadata_says_which_torch_and_which_ops_are_traced(tmp_path):
    res = _one_rank(tmp_path, "")
    assert res.returncode == 0, res.stderr
    assert "group TracingProcessGroup" in res.stdout
    meta = json.loads(next((tmp_path / "run" / "ranks").glob("rank-*.json")).read_text())
    assert meta["torch"] == torch.__version__
    assert meta["traced_ops"]["all_reduce"] == "allreduce"
    assert meta["untraceable_ops"] == []
