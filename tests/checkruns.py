"""`distdoctor check` as its tests run it (test_check*.py): its JSON report, the report's
rows, and an environment without the caller's NCCL, gloo, rendezvous or GPU settings."""

from __future__ import annotations

import json
import os

import pytest
from conftest import run_cli


def check(args: list[str], env: dict | None = None, timeout: float = 120):
    proc = run_cli(["check", "--json", *args], timeout=timeout, env=env)
    try:
        return proc, json.loads(proc.stdout)
    except ValueError:
        pytest.fail(f"no JSON (exit {proc.returncode}): {proc.stdout[-2000:]} "
                    f"{proc.stderr[-2000:]}")


def rows_of(report: dict, status: str | None = None) -> list[dict]:
    return [r for r in report["rows"] if status is None or r["status"] == status]


def _env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("NCCL_", "GLOO_", "TORCH_NCCL_", "MASTER_"))
           and k != "CUDA_VISIBLE_DEVICES"}
    return {**env, **extra}
