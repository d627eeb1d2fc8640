"""Environment that arms the tracer in every Python process of a job."""

from __future__ import annotations

import os
import random
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


# Ports handed to a job's store (MASTER_PORT) are drawn from below the kernel's ephemeral
# range: the port is free when drawn, but the rank binds it seconds later (after importing
# torch), and every outgoing connection of the machine (gloo opens dozens per rank) and
# every bind to port 0 takes its port from the ephemeral range meanwhile. A port from that
# range was taken in between (EADDRINUSE at the store, the job dead before its first op)
# on a busy machine; below it, only a listener that asks for that very port can.
LOW_PORTS = (10_000, 32_768)  # the draw, where the ephemeral range leaves room below it
DRAWS = 64
EPHEMERAL = "/proc/sys/net/ipv4/ip_local_port_range"


def free_port() -> int:
    """A TCP port free on every address of this machine for a job's store to listen on."""
    lo, hi = LOW_PORTS
    try:
        with open(EPHEMERAL) as f:
            hi = min(hi, int(f.read().split()[0]))
    except (OSError, ValueError, IndexError):
        pass  # (no /proc: the usual range's floor)
    rng = random.SystemRandom()
    for _ in range(DRAWS if hi > lo else 0):
        port = rng.randrange(lo, hi)
        if _bindable(port):
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # the kernel's choice
        s.bind(("", 0))
        return s.getsockname()[1]


def _bindable(port: int) -> bool:
    """Nothing listens on, or holds, `port` on any IPv4 address (a socket in TIME_WAIT
    there counts as held: the store may not use SO_REUSEADDR)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


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
