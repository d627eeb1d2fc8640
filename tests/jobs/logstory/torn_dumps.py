"""Stack dumps written at the same moment by two ranks into one combined log, for real.

The story job's two ranks wait in a store that never fills, each with faulthandler
registered on SIGUSR1; both are sent SIGUSR1 back to back, so their dumps go to the
launcher's stdout together and, more often than not, tear each other's lines (faulthandler
writes a frame in pieces). Then the launcher is stopped with SIGTERM, as a user would.
Variants (`record`'s flags): the log ends with the dumps; the ranks abort instead (fatal
errors printed together); torchrun's `--tee 3` (whole prefixed lines, never torn).

    python tests/jobs/logstory/torn_dumps.py OUT.log [--no-stop]   # one torn log (retries)

`record(path)` returns whether the log it wrote holds a torn line. Every run has a hard
time limit; afterwards its launcher's session and each worker's (torchrun starts every
worker in a session of its own) are killed.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

JOB = Path(__file__).with_name("story_job.py")
RANKS = 2
_HEAD = re.compile(r"(?:Current thread|Thread) 0x")


def torn(text: str) -> bool:
    """Whether two dumps wrote into one of `text`'s lines: two frames' words in it, two
    heads, or a head after other text."""
    for line in text.splitlines():
        heads = _HEAD.findall(line)
        if line.count("File ") > 1 or len(heads) > 1 or (heads and (
                not _HEAD.match(line) or "File " in line)):
            return True
    return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def record(log: Path, stop: bool = True, tee: bool = False, abort: bool = False,
           limit_s: float = 40.0) -> bool:
    """One run into `log`; True if two dumps tore each other's lines in it. `stop`: the
    launcher is sent SIGTERM after the dumps (and says so); else the log ends with them
    (a log copied while the job still hung), and the run is killed unseen. `tee`: each
    rank writes a file of its own, which torchrun copies to its output line by line
    with a `[defaultN]:` prefix (`--tee 3`): whole lines, of two ranks in turn. `abort`:
    the ranks are sent SIGABRT instead and die of it, each printing faulthandler's
    "Fatal Python error: Aborted" and its stack (as ranks whose watchdogs expire together
    do), and the launcher reports their exits."""
    deadline = time.monotonic() + limit_s
    workers: list[int] = []
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(RANKS),
             "--master-port", str(free_port()),
             *(["--tee", "3", "--log-dir", str(log.with_suffix(".ranks"))] if tee else []),
             str(JOB), "--fault", "store-never-fills",
             "--port", str(free_port()), "--dump-on", "abort" if abort else "usr1"],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
        try:
            while time.monotonic() < deadline and proc.poll() is None:
                if log.read_text().count("init_process_group (world") >= RANKS:
                    break
                time.sleep(0.1)
            time.sleep(0.5)  # both inside the store's wait
            workers = _children(proc.pid)
            for pid in workers:
                os.kill(pid, signal.SIGABRT if abort else signal.SIGUSR1)
            while time.monotonic() < deadline and proc.poll() is None:
                if len(re.findall(r"thread 0x", log.read_text(), re.I)) >= RANKS:
                    break
                time.sleep(0.1)
            time.sleep(0.3)
            if abort:
                proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            elif stop:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        finally:
            # torchrun starts each worker in a session of its own: each is killed by name
            for group in (*workers, *_children(proc.pid), proc.pid):
                try:
                    os.killpg(group, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            proc.wait()
    return torn(log.read_text())


if __name__ == "__main__":
    out = Path(sys.argv[1])
    for attempt in range(1, 11):
        if record(out, stop="--no-stop" not in sys.argv):
            print(f"torn on attempt {attempt}: {out}")
            break
    else:
        sys.exit("no two dumps tore in 10 attempts")
