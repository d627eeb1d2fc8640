"""Environment that arms the tracer in every Python process of a job."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import distdoctor.launch.bootstrap as bootstrap
from distdoctor.runlog.rundir import ENV_RUN_DIR

BOOTSTRAP_DIR = str(Path(bootstrap.__file__).resolve().parent)
# `--nproc N` starts N processes on this machine, an environment each: past this it is a
# typo (--nproc 10000000 took 10 GB building environments before starting any), and a job
# larger than a node runs under a launcher per node
MAX_LOCAL_RANKS = 4096


def check_nproc(nproc: int | None, command: str) -> str | None:
    """Why `--nproc` cannot be used (one line), or None."""
    if nproc is None or 1 <= nproc <= MAX_LOCAL_RANKS:
        return None
    if nproc < 1:
        return f"{command}: --nproc must be at least 1"
    return (f"{command}: --nproc {nproc} is more processes than one machine runs (at most "
            f"{MAX_LOCAL_RANKS}); a larger job runs a launcher per node")


def traced_env(run_dir: str | os.PathLike, base: dict | None = None) -> dict:
    """`base` (default: this process's environment) plus the tracer's switches."""
    env = dict(os.environ if base is None else base)
    env[ENV_RUN_DIR] = str(Path(run_dir).resolve())
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([BOOTSTRAP_DIR] + [p for p in paths if p != BOOTSTRAP_DIR])
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_env(env: dict, rank: int, world: int, master_port: int) -> dict:
    """torchrun's environment contract for local rank `rank` of a one-node job."""
    env = dict(env)
    env.update({
        "RANK": str(rank), "LOCAL_RANK": str(rank), "GROUP_RANK": "0",
        "ROLE_RANK": str(rank), "ROLE_WORLD_SIZE": str(world),
        "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world),
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(master_port),
        "TORCHELASTIC_RUN_ID": env.get("TORCHELASTIC_RUN_ID", "distdoctor"),
    })
    env.setdefault("OMP_NUM_THREADS", "1")  # as torchrun does: N ranks share the cores
    return env
