"""The guardian: stops the job when `distdoctor run` dies without doing so (SIGKILL, a
crash), so that the job's processes never outlive it, as torchrun's workers do not
outlive torchrun.

`run` starts it before the job and holds the write end of a pipe whose read end is the
guardian's stdin. The guardian sleeps in a read (no CPU, no polling). At its normal end
`run` writes "done" and closes the pipe: the guardian exits. End of file without "done"
means `run` died: the guardian finds the job's processes by their cookie (reaper.py),
sends SIGTERM, SIGKILL after the grace period, says so in one line on stderr, and writes
RUN_DIR/exits.json if `run` had not.

It runs in a session of its own (a terminal's Ctrl-C or a kill of run's process group
does not reach it), does not carry the cookie, and starts as `python -I -S guardian.py`:
no site, no torch, no distdoctor import (about 10 ms).
"""

from __future__ import annotations

import os
import signal
import sys

if __package__:
    from distdoctor.launch import reaper
else:  # the guardian process: load reaper.py beside this file, without any sys.path
    import importlib.util

    _spec = importlib.util.spec_from_file_location(
        "distdoctor_reaper", os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                          "reaper.py"))
    reaper = sys.modules[_spec.name] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(reaper)

DONE = b"done\n"


class Guardian:
    """`run`'s side: start it, and release it once the job is over and nothing is left."""

    def __init__(self, proc, pipe_w: int):
        self.proc = proc
        self._w: int | None = pipe_w

    @property
    def pid(self) -> int:
        return self.proc.pid

    @classmethod
    def start(cls, cookie: str, grace_s: float, run_dir) -> Guardian | None:
        """None where it cannot start (the job then runs unguarded: never a reason to fail
        the job)."""
        import subprocess

        r, w = os.pipe()  # both ends close-on-exec: only the guardian gets r, as stdin
        try:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", os.path.abspath(__file__), cookie, str(grace_s),
                 str(run_dir or ""), str(reaper.start_time(os.getpid()) or 0)],
                stdin=r, stdout=subprocess.DEVNULL, start_new_session=True)
        except OSError:
            os.close(w)
            return None
        finally:
            os.close(r)
        return cls(proc, w)

    def release(self) -> None:
        """The job is over and nothing of it is left: the guardian exits."""
        if self._w is None:
            return
        try:
            os.write(self._w, DONE)
        except OSError:
            pass  # it is gone already
        os.close(self._w)
        self._w = None
        try:  # it holds our stderr: whoever reads it to its end should not wait on it
            self.proc.wait(timeout=2)
        except Exception:  # subprocess.TimeoutExpired: it exits on its own
            pass


# -- the guardian process --------------------------------------------------------------------
def _wait_for_run() -> bool:
    """Block until run closes the pipe or dies; True when it said it is done."""
    got = b""
    while True:
        try:
            chunk = os.read(0, 64)
        except InterruptedError:
            continue
        except OSError:
            return False
        if not chunk:
            return got.endswith(DONE)
        got = (got + chunk)[-len(DONE):]


def _write_exits(run_dir: str, stopped: list) -> None:
    """exits.json as run would have written it, if run had not: the ranks stopped by
    distdoctor (their exit codes are unknown: only run was their parent)."""
    path = os.path.join(run_dir, "exits.json")
    if not run_dir or not os.path.isdir(run_dir) or os.path.exists(path):
        return
    ranks: dict[int, dict] = {}
    for m, _ in sorted(stopped, key=lambda s: s[0].start or 0):  # oldest: the rank itself
        if m.rank is not None and m.rank not in ranks:
            ranks[m.rank] = {"rank": m.rank, "pid": m.pid, "exit_code": None, "signal": None,
                             "stopped_by_distdoctor": True}
    data = {"stopped_by_distdoctor": True, "run_died": True,
            "processes": [ranks[r] for r in sorted(ranks)],
            "stopped_processes": [{"pid": m.pid, "command": m.command, "rank": m.rank,
                                   "signal": sig} for m, sig in stopped]}
    tmp = f"{path}.guardian.tmp"
    try:
        import json

        with open(tmp, "w") as f:
            json.dump(data, f, indent=1)
        os.replace(tmp, path)
    except OSError:
        pass


def main(argv: list[str]) -> int:
    cookie, grace_s, run_dir, since = argv[0], float(argv[1]), argv[2], int(argv[3])
    for sig in (signal.SIGINT, signal.SIGHUP):  # its job outlives a hang-up: so must it
        signal.signal(sig, signal.SIG_IGN)
    if _wait_for_run():
        return 0
    stopped = reaper.stop_all(lambda: reaper.find_job(cookie, since), grace_s)
    if stopped:
        names = ", ".join(f"{m.pid} ({m.command})" for m, _ in stopped[:8])
        more = f" and {len(stopped) - 8} more" if len(stopped) > 8 else ""
        try:
            print(f"distdoctor: run ended without stopping its job; stopped {len(stopped)} "
                  f"process(es) of it: {names}{more}", file=sys.stderr, flush=True)
        except OSError:
            pass  # nobody reads run's stderr any more
        _write_exits(run_dir, stopped)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
