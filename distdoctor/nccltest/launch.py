"""`--nproc N`: start N local ranks with torchrun's environment contract, wait, clean up.

Each rank gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR (127.0.0.1) and
MASTER_PORT (a port free at launch), and the options as JSON. When one rank fails, the
others get `grace_s` seconds to finish (they may be blocked in a collective with it), then
are terminated, then killed: no rank outlives the launcher.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from distdoctor.launch.env import free_port, rank_env
from distdoctor.nccltest.options import Options
from distdoctor.nccltest.worker import OPTIONS_ENV


def nccl_test_env(base: dict, rank: int, world: int, port: int, opts: Options) -> dict:
    """torchrun's contract for local rank `rank`, plus the sweep's options."""
    env = rank_env(base, rank, world, port)
    env.update({OPTIONS_ENV: opts.to_json(), "PYTHONUNBUFFERED": "1"})
    return env


def launch(opts: Options, nproc: int, command: list[str] | None = None,
           grace_s: float = 5.0) -> int:
    """Run `command` (default: the nccl-test worker) as `nproc` ranks; the job's exit code."""
    cmd = command or [sys.executable, "-m", "distdoctor.nccltest.worker"]
    port = free_port()
    procs: list[subprocess.Popen] = []
    try:
        for rank in range(nproc):
            procs.append(subprocess.Popen(cmd, env=nccl_test_env(os.environ, rank, nproc, port,
                                                                  opts)))
        return _wait(procs, grace_s)
    except KeyboardInterrupt:
        return 130
    finally:
        _stop(procs)


def _wait(procs: list[subprocess.Popen], grace_s: float) -> int:
    first_failure: int | None = None
    deadline: float | None = None
    while True:
        codes = [p.poll() for p in procs]
        if all(c is not None for c in codes):
            break
        failed = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
        if failed and first_failure is None:
            rank, first_failure = failed[0]
            deadline = time.monotonic() + grace_s
            if first_failure < 0:  # a signal: the rank could not say why itself
                print(f"distdoctor: error: rank {rank} was killed by signal {-first_failure}",
                      file=sys.stderr)
        if deadline is not None and time.monotonic() > deadline:
            _stop(procs)
            break
        time.sleep(0.05)
    codes = [p.returncode for p in procs]
    if first_failure is not None:
        return first_failure if first_failure > 0 else 1
    return next((c for c in codes if c), 0)


def _stop(procs: list[subprocess.Popen], timeout_s: float = 5.0) -> None:
    """Terminate, then kill, the ranks still running (only the ones we started)."""
    running = [p for p in procs if p.poll() is None]
    for p in running:
        p.terminate()
    end = time.monotonic() + timeout_s
    for p in running:
        try:
            p.wait(max(0.0, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
