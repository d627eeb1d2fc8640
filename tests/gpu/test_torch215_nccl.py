"""torch >= 2.15 with its default `nccl` (ProcessGroupNCCL2) under `distdoctor run`, on 2
GPUs (issue 51): the job is traced, torch's own Flight Recorder is filled under
distdoctor as bare, its NaN check still refuses a NaN, and hooks fire traced as bare.

Expectations, and the torch source each comes from (torch 2.15.0):
- `nccl` builds ProcessGroupNCCL2 by default, whose backend calls itself "nccl2"
  (`distributed_c10d.py`, `_register_builtin_nccl_backend`; `nccl2/ProcessGroupNCCL.hpp`,
  `kBackendName`);
- nccl2 has no recorder of its own: with TORCH_FR_BUFFER_SIZE set torch attaches a
  `FlightRecorderHook`, which records from the c10d dispatcher kernels into the recorder
  named after the backend, entries named `nccl2:<op>` (`_maybe_attach_flight_recorder`,
  `_FR_SELF_RECORDING_BACKENDS`; `hooks/FlightRecorderHook.hpp`; `flight_recorder/
  components/types.py`, `Op`). A tracer that skips the dispatcher leaves it empty;
- TORCH_DIST_NAN_CHECK=1 attaches `NanCheckHook` to every group (`_new_process_group_helper`).

Run by `benchmarks/gpu_suite.py --stage torch215` (not by the `tests` stage). Skipped, with
the reason, where there is no CUDA or fewer than 2 GPUs (conftest) or torch < 2.15.
"""

from __future__ import annotations

import json
import os
import sys

import pytest
import torch
from conftest import run_cli, run_ranks_bare

from distdoctor.runlog.run import read_run
from gpu.gpu_support import JOBS, note_measurement

NEW_ENOUGH = torch.torch_version.TorchVersion(torch.__version__) >= (2, 15)
pytestmark = [
    pytest.mark.gpu(2), pytest.mark.timeout(300),
    pytest.mark.skipif(not NEW_ENOUGH, reason=f"GPU tier: torch {torch.__version__} is older "
                       "than 2.15 (no nccl2, no ProcessGroup hooks): run the torch215 stage "
                       "with a torch 2.15 interpreter"),
]
FR_ENV = {"TORCH_FR_BUFFER_SIZE": "2000"}


def _clean_env(extra: dict | None = None) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("DISTDOCTOR") and k != "TORCH_DIST_USE_NCCL2"}
    env.update(extra or {}, PYTHONUNBUFFERED="1")
    return env


def bare(job: str, *args: str, env: dict | None = None, timeout: float = 120) -> list[str]:
    """2 ranks launched torchrun-style without distdoctor; each rank's output."""
    return run_ranks_bare([sys.executable, str(JOBS / job), *args], _clean_env(env), 2,
                          timeout, f"{job} bare")


def traced(job: str, run_dir, *args: str, env: dict | None = None, timeout: float = 180):
    proc = run_cli(["run", "--nproc", "2", "--run-dir", str(run_dir), "--grace", "2", "--",
                    str(JOBS / job), *args], timeout=timeout, env=_clean_env(env),
                   run_dir=run_dir)
    return proc


def _read(directory, stem: str) -> dict[int, dict]:
    return {r: json.loads((directory / f"{stem}-{r}.json").read_text()) for r in (0, 1)}


def test_default_nccl_is_traced_and_torchs_flight_recorder_fills_as_bare(tmp_path):
    bare_dir, traced_dir = tmp_path / "bare", tmp_path / "traced"
    bare_dir.mkdir()
    traced_dir.mkdir()
    bare("nccl2_fr.py", str(bare_dir), env=FR_ENV)
    proc = traced("nccl2_fr.py", tmp_path / "run", str(traced_dir), env=FR_ENV)
    assert proc.returncode == 0, proc.stderr[-3000:]
    b, t = _read(bare_dir, "fr"), _read(traced_dir, "fr")
    for rank in (0, 1):
        assert b[rank]["backend_name"] == "nccl2", f"torch's default nccl is {b[rank]}"
        assert b[rank]["entries"], f"rank {rank}: torch's FR empty even bare: {b[rank]}"
        assert all(n.startswith("nccl2:") for n in b[rank]["entries"]), b[rank]["entries"]
        assert t[rank]["group"] == "TracingProcessGroup", t[rank]
        # the dispatcher route: torch's FlightRecorderHook saw every op the tracer issued
        assert t[rank]["entries"] == b[rank]["entries"], (rank, b[rank], t[rank])
        note_measurement("torch215_fr_entries", rank=rank, bare=len(b[rank]["entries"]),
                         traced=len(t[rank]["entries"]), states=t[rank]["states"])
    run = read_run(tmp_path / "run")
    assert sorted(run.events) == [0, 1]
    for rank, events in run.events.items():
        ops = [e.op for e in events]
        assert ops.count("all_reduce") >= 5 and "reduce_scatter_tensor" in ops, ops
        assert any(e.device.startswith("cuda") for e in events), rank
        assert run.meta[rank]["backend_names"].get("cuda") == "nccl2", run.meta[rank]


def test_torchs_nan_check_refuses_a_nan_traced_as_bare(tmp_path):
    env = {"TORCH_DIST_NAN_CHECK": "1"}
    outs = bare("nccl_nan_check.py", env=env)
    assert all("NAN-REFUSED" in out for out in outs), outs
    proc = traced("nccl_nan_check.py", tmp_path / "run", env=env)
    assert proc.stdout.count("NAN-REFUSED") == 2, proc.stdout[-2000:] + proc.stderr[-2000:]


def test_hooks_fire_traced_as_bare_on_cuda(tmp_path):
    bare_dir, traced_dir = tmp_path / "bare", tmp_path / "traced"
    bare_dir.mkdir()
    traced_dir.mkdir()
    bare("hook_count_cuda.py", str(bare_dir))
    proc = traced("hook_count_cuda.py", tmp_path / "run", str(traced_dir))
    assert proc.returncode == 0, proc.stderr[-3000:]
    b, t = _read(bare_dir, "hooks"), _read(traced_dir, "hooks")
    for rank in (0, 1):
        assert t[rank].pop("group") == "TracingProcessGroup"
        assert b[rank].pop("group") == "ProcessGroup"
        assert "ALLREDUCE" in b[rank]["pre"] and b[rank]["pre"] == b[rank]["post"], b[rank]
        assert b[rank]["pairs"] == sum(b[rank]["pre"].values())
        assert t[rank] == b[rank], (rank, b[rank], t[rank])
        note_measurement("torch215_hooks", rank=rank, calls=b[rank]["pairs"])
