"""The GPU tier: tests only a CUDA machine with NCCL can run (marker `gpu`).

Where CUDA is absent every `gpu` test is skipped with the reason (which torch, what it
lacks), never passed; `@pytest.mark.gpu(2)` also skips, saying so, where fewer than two
GPUs are visible. Run the tier alone with `pytest tests/gpu -m gpu`, or through
benchmarks/gpu_suite.py, which also collects its measurements and NVML recordings.
"""

from __future__ import annotations

import functools
import os

import pytest


@functools.cache
def cuda_state() -> tuple[int, str]:
    """(GPUs this process can use, why none when 0). Only asks torch what it sees: no
    tensor goes to a GPU in the pytest process itself."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError as exc:
        return 0, f"GPU tier: torch cannot be imported ({exc})"
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    hidden = f"; CUDA_VISIBLE_DEVICES={visible!r}" if visible is not None else ""
    if torch.version.cuda is None:
        return 0, f"GPU tier: no CUDA here: torch {torch.__version__} is a CPU build"
    if not torch.cuda.is_available():
        return 0, (f"GPU tier: no CUDA here: torch {torch.__version__} (CUDA "
                   f"{torch.version.cuda}) finds no usable GPU{hidden}")
    if not (dist.is_available() and dist.is_nccl_available()):
        return 0, f"GPU tier: torch {torch.__version__} has no NCCL backend"
    return torch.cuda.device_count(), ""


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu(n=1): needs CUDA, NCCL and n GPUs (tests/gpu); "
                            "skipped with the reason where they are absent")


def pytest_collection_modifyitems(config, items):
    for item in items:
        wanted = [m.args[0] if m.args else 1 for m in item.iter_markers("gpu")]
        if not wanted:
            continue
        have, why = cuda_state()
        if have == 0:
            item.add_marker(pytest.mark.skip(reason=why))
        elif have < max(wanted):
            item.add_marker(pytest.mark.skip(
                reason=f"GPU tier: needs {max(wanted)} GPUs, this machine has {have}"))
