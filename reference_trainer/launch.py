"""A minimal local launcher for tests and benchmarks: N ranks of the trainer as subprocesses
with torchrun's environment contract (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
MASTER_ADDR, MASTER_PORT).

Like torchrun it fails fast: when one rank exits non-zero (or is killed), the others get
SIGTERM, then SIGKILL. Unlike torchrun it has no agent process and no restarts, so a test
sees each rank's own exit code and output. For real jobs use torchrun or `distdoctor run`.

Two ways to start ranks:
  "subprocess"  a fresh `python -m distdoctor.reference_trainer` per rank, as torchrun does.
  "forkserver"  ranks are forked from a server process that imported torch once. Each rank
                is still its own process with its own process group, env and exit code;
                only the ~4 s of CPU per rank for `import torch` is saved, which on a
                2-core machine is most of a short test's wall time.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from distdoctor.launch.env import free_port

MODULE = "distdoctor.reference_trainer"


@dataclass
class JobResult:
    returncodes: list[int]  # negative: killed by that signal (torchrun's convention)
    stopped: list[int]  # ranks the launcher terminated (after a failure or the deadline)
    stdout: list[str]
    stderr: list[str]
    timed_out: bool
    wall_s: float

    @property
    def ok(self) -> bool:
        return not self.timed_out and not self.stopped and all(rc == 0 for rc in self.returncodes)

    def steps(self, rank: int = 0) -> list[dict]:
        """The step log lines of `rank` (rank 0 is the one that logs), parsed."""
        from .train import parse_step_log

        return parse_step_log(self.stdout[rank])

    def tail(self, chars: int = 3000) -> str:
        """Every rank's output, for assertion messages."""
        parts = [f"--- rank {r} rc={rc}\n{out}\n{err}"
                 for r, (rc, out, err) in enumerate(zip(self.returncodes, self.stdout,
                                                        self.stderr, strict=True))]
        return "\n".join(p[-chars:] for p in parts)


# Imported once by the fork server, so forked ranks start with them in memory.
_PRELOAD = ["torch", "torch.distributed.tensor.parallel", "torch.distributed.fsdp",
            "torch.distributed.pipelining", "distdoctor.reference_trainer.train"]
_forkserver = None


def _forkserver_context():
    global _forkserver
    if _forkserver is None:
        import multiprocessing

        _forkserver = multiprocessing.get_context("forkserver")
        _forkserver.set_forkserver_preload(_PRELOAD)
    return _forkserver


def _forked_rank(env: dict, args: list[str], out_path: str, err_path: str) -> None:
    """Body of a forked rank: torchrun's env, own stdout/stderr files, exit code of main()."""
    import traceback

    os.environ.clear()
    os.environ.update(env)
    for fd, path in ((1, out_path), (2, err_path)):
        target = os.open(path, os.O_WRONLY | os.O_APPEND)
        os.dup2(target, fd)
        os.close(target)
    code = 1
    try:
        from distdoctor.reference_trainer.train import main

        code = main(args)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()  # what the interpreter would print, then exit 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


class _ForkedRank:
    """The subset of Popen's interface that launch() uses, over a multiprocessing.Process."""

    def __init__(self, env: dict, args: list[str], out_path: str, err_path: str):
        ctx = _forkserver_context()
        self._p = ctx.Process(target=_forked_rank, args=(env, args, out_path, err_path))
        self._p.start()
        self.pid = self._p.pid

    def poll(self):
        return self._p.exitcode

    @property
    def returncode(self):
        return self._p.exitcode

    def wait(self, timeout):
        self._p.join(timeout)
        if self._p.exitcode is None:
            raise subprocess.TimeoutExpired("rank", timeout)


def launch(nproc: int, args: list[str], timeout_s: float = 120.0, env: dict | None = None,
           grace_s: float = 2.0, start: str = "subprocess",
           command: list[str] | None = None) -> JobResult:
    """Run `python -m distdoctor.reference_trainer ARGS` on `nproc` local ranks.

    Returns when every rank has exited, or after `timeout_s` (then all are killed and
    `timed_out` is set). `grace_s` is how long the others get to exit by themselves after
    the first failure before they are terminated, so they can print their own error.
    `start` is "subprocess" or "forkserver" (see the module docstring); `command` replaces
    the subprocess command line (e.g. to run the trainer under `distdoctor run`).
    """
    if start not in ("subprocess", "forkserver"):
        raise ValueError(f"start must be 'subprocess' or 'forkserver', not {start!r}")
    command = command or [sys.executable, "-m", MODULE]
    port = free_port()
    base = {**os.environ, **(env or {}), "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port), "WORLD_SIZE": str(nproc),
            "LOCAL_WORLD_SIZE": str(nproc), "OMP_NUM_THREADS": "1"}
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="reftrainer-") as tmp:
        procs, files = [], []
        for rank in range(nproc):
            out = open(os.path.join(tmp, f"{rank}.out"), "w+")  # noqa: SIM115
            err = open(os.path.join(tmp, f"{rank}.err"), "w+")  # noqa: SIM115
            files.append((out, err))
            rank_env = {**base, "RANK": str(rank), "LOCAL_RANK": str(rank)}
            if start == "forkserver":
                procs.append(_ForkedRank(rank_env, list(args), out.name, err.name))
                continue
            procs.append(subprocess.Popen(
                [*command, *args], stdout=out, stderr=err, stdin=subprocess.DEVNULL,
                env=rank_env, start_new_session=True))  # own group: kills reach its children
        timed_out = False
        failed_at = None
        try:
            while any(p.poll() is None for p in procs):
                now = time.monotonic()
                if now - started > timeout_s:
                    timed_out = True
                    break
                if failed_at is None and any(p.returncode not in (None, 0) for p in procs):
                    failed_at = now
                if failed_at is not None and now - failed_at > grace_s:
                    break
                time.sleep(0.05)
        finally:
            stopped = [r for r, p in enumerate(procs) if p.poll() is None]
            _stop(procs)
        outputs = []
        for out, err in files:
            out.seek(0)
            err.seek(0)
            outputs.append((out.read(), err.read()))
            out.close()
            err.close()
    return JobResult([p.returncode for p in procs], stopped, [o for o, _ in outputs], [e for _, e in outputs], timed_out,
                     time.monotonic() - started)


def _stop(procs: list) -> None:
    """SIGTERM whatever still runs, SIGKILL after 3 s; reap everything."""
    for sig, wait_s in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 5.0)):
        alive = [p for p in procs if p.poll() is None]
        for p in alive:
            try:  # a Popen rank leads its own process group; a forked rank is one process
                os.killpg(p.pid, sig) if isinstance(p, subprocess.Popen) else os.kill(p.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + wait_s
        for p in alive:
            try:
                p.wait(max(deadline - time.monotonic(), 0.01))
            except subprocess.TimeoutExpired:
                pass
