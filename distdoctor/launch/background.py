"""`distdoctor run` as a child process, for a front end that shows something else while the
job runs (`distdoctor demo` behind the dashboard).

Stopping it goes through `run`'s own SIGTERM wind-down (ranks stopped, exit codes, last
findings, summary). Should `run` itself not answer, it is killed together with the ranks,
whose pids its run dir records (each rank runs in a process group of its own).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path


class BackgroundRun:
    def __init__(self, run_dir: Path, run_args: list[str], log_path: Path):
        self.run_dir = run_dir
        cmd = [sys.executable, "-m", "distdoctor", "run", "--run-dir", str(run_dir), *run_args]
        with open(log_path, "w") as log:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)

    @property
    def running(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout_s: float = 60.0) -> int:
        """Stop the job (if it still runs) and return `run`'s exit code."""
        if self.running:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self._kill()
        return self.proc.returncode

    def _kill(self) -> None:
        pids = [self.proc.pid]
        from distdoctor.runlog.rundir import rank_meta_at

        for meta in (self.run_dir / "ranks").glob("rank-*.json"):
            pid = rank_meta_at(meta)[0].get("pid")  # (checked; never a wait on a FIFO)
            if isinstance(pid, int) and pid > 0:
                pids.append(pid)
        for pid in pids:
            try:
                os.killpg(pid, signal.SIGKILL)  # run, and ranks it started, lead their groups
            except ProcessLookupError:
                try:  # a rank a wrapped launcher started
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            except PermissionError:
                pass
        self.proc.wait()
