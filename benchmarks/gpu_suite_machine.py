"""The GPU suite's machine (benchmarks/gpu_suite.py): what the interpreter running it has
(torch, CUDA, NCCL, the GPUs, the driver, the packages the suite needs), asked in a child
from outside the tree; the project installed from the working tree when it is not yet
(pip, offline, editable; carried wheels first); and why the CUDA parts are skipped, if
they are."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Protocol

ROOT = Path(__file__).resolve().parent.parent


class Suite(Protocol):
    """What the install needs of the suite (gpu_suite.Suite): its folder, a child process
    under its budget, a line in its log."""

    work: Path

    def child(self, argv: list[str], env: dict | None = None, cwd: Path = ROOT,
              timeout_s: float | None = None) -> tuple[int | None, str]: ...

    def say(self, text: str) -> None: ...


PROBE = """
import importlib.util, json, shutil, sys
facts = {"python": sys.version.split()[0], "executable": sys.executable}
try:
    import torch, torch.distributed as dist
    facts.update(torch=torch.__version__, torch_cuda=torch.version.cuda,
                 cuda_available=torch.cuda.is_available(),
                 nccl=dist.is_available() and dist.is_nccl_available())
    if facts["cuda_available"]:
        facts["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        facts["nccl_version"] = ".".join(map(str, torch.cuda.nccl.version()))
except Exception as exc:
    facts["torch_error"] = f"{type(exc).__name__}: {exc}"
facts["missing"] = [m for m in ("rich", "psutil", "pynvml", "prometheus_client", "textual",
                                "pytest", "pytest_timeout", "triton")
                    if importlib.util.find_spec(m) is None]
if shutil.which("py-spy") is None:
    facts["missing"].append("py-spy")
try:
    import distdoctor, distdoctor.probes, distdoctor.reference_trainer
    facts["distdoctor"] = distdoctor.__file__
except Exception as exc:
    facts["distdoctor_error"] = f"{type(exc).__name__}: {exc}"
print("FACTS " + json.dumps(facts))
"""


def machine_facts(suite: Suite, env: dict | None = None) -> dict:
    """What this interpreter has (asked in a child: no CUDA in this process), from a
    folder outside the tree, so that only an installed distdoctor counts."""
    code, out = suite.child([sys.executable, "-c", PROBE], env=env, cwd=suite.work,
                            timeout_s=180)
    facts = next((json.loads(line[6:]) for line in out.splitlines()
                  if line.startswith("FACTS ")), {"probe_error": out[-500:]})
    facts["cpus"] = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
        os.cpu_count())
    smi = shutil.which("nvidia-smi")
    if smi:
        text = subprocess.run([smi], capture_output=True, text=True, timeout=60).stdout
        driver = re.search(r"Driver Version:\s*([\d.]+)", text)
        cuda = re.search(r"CUDA Version:\s*([\d.]+)", text)
        facts["driver"] = driver[1] if driver else None
        facts["driver_cuda"] = cuda[1] if cuda else None
    return facts


def installed_here(facts: dict) -> bool:
    path = facts.get("distdoctor")
    return bool(path) and Path(path).resolve().is_relative_to(ROOT)


def ensure_installed(suite: Suite) -> tuple[dict, str]:
    """(machine facts, how the project is installed); raises RuntimeError when it cannot be."""
    facts = machine_facts(suite)
    if installed_here(facts):
        return facts, f"already installed from this tree ({facts['distdoctor']})"
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps"]
    wheels = sorted(str(p) for p in (ROOT / ".whl").glob("*.whl"))
    if wheels:  # carried: packages the machine lacks (README: textual, py-spy)
        code, out = suite.child([*pip, *wheels], timeout_s=300)
        if code != 0:
            suite.say(f"could not install the carried wheels: {out.strip()[-300:]}")
    code, out = suite.child([*pip, "--no-build-isolation", "-e", str(ROOT)], timeout_s=300)
    facts = machine_facts(suite)
    if code != 0 or not installed_here(facts):
        raise RuntimeError("cannot install distdoctor from the working tree offline "
                           f"(pip -e . exit {code}): {(out.strip() or str(facts))[-400:]}")
    return facts, f"pip install -e . (offline){f', {len(wheels)} carried wheels' if wheels else ''}"


def cuda_reason(facts: dict, cpu_only: bool) -> str:
    """Why the CUDA parts are skipped, or '' when they run."""
    if cpu_only:
        return "--cpu-only dry run: CUDA hidden (CUDA_VISIBLE_DEVICES='')"
    if "torch" not in facts:
        return f"torch cannot be imported: {facts.get('torch_error', facts)}"
    where = (f"the driver ({facts['driver']}) supports CUDA {facts.get('driver_cuda')}"
             if facts.get("driver") else "no nvidia-smi here: no NVIDIA driver")
    if facts.get("torch_cuda") is None:
        return (f"torch {facts['torch']} at {facts['executable']} is a CPU build; {where}. "
                "This machine cannot download the CUDA build: run the suite with the "
                "interpreter that has it (the GPU image's python3)")
    if not facts.get("cuda_available"):
        return f"torch {facts['torch']} (CUDA {facts['torch_cuda']}) sees no GPU; {where}"
    if not facts.get("nccl"):
        return f"torch {facts['torch']} has no NCCL"
    return ""
