"""Start the check's ranks (N local ones, or the job's torchrun line with the check in
place of the script), wait for them within a deadline, and read what they found. Their
output goes to files in a temporary folder: on a failure, the last lines say why."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from distdoctor.check.rank import CHECKPOINT_ENV, OUT_ENV, SWEEP_ENV


def run_ranks(nproc: int | None, launcher: list[str] | None, checkpoint_dir: str | None,
              sweep: bool, timeout_s: float) -> tuple[dict | None, str, str]:
    """(the job's facts, "", "") or (None, why there are none, what to do). When the
    check's own ranks fail, their output goes through the log diagnosis: the failure is
    named with its remedy (a variable that breaks init_process_group), not a raw line."""
    from distdoctor.termination import ends_through_finally, termination_held

    # SIGTERM or SIGHUP (a scheduler's cancel) stops the ranks and removes their folder, as
    # Ctrl-C does: by default the check ended alone, its ranks ran on in their sessions
    with ends_through_finally():
        with termination_held():
            folder = tempfile.TemporaryDirectory(prefix="distdoctor-check-")
        try:
            return _run_in(folder.name, nproc, launcher, checkpoint_dir, sweep, timeout_s)
        finally:
            with termination_held():  # (a signal amid the removal: the rest left behind)
                folder.cleanup()


def _run_in(tmp: str, nproc: int | None, launcher: list[str] | None,
            checkpoint_dir: str | None, sweep: bool, timeout_s: float):
    """run_ranks() with its output in `tmp`."""
    from distdoctor.launch.env import free_port, rank_env
    from distdoctor.termination import termination_held

    out = Path(tmp) / "job.json"
    env = dict(os.environ)
    env.update({OUT_ENV: str(out), SWEEP_ENV: "1" if sweep else "0",
                "PYTHONUNBUFFERED": "1"})
    if checkpoint_dir:
        env[CHECKPOINT_ENV] = os.path.abspath(checkpoint_dir)
    if launcher is not None:
        # the launcher's temp dirs (torchrun's torchelastic_*) inside the check's folder, so
        # they go with it: torchrun removes them on SIGTERM only if it ends within the stop's
        # grace, and one slow to end was killed and left its folder in the user's temp dir
        env["TMPDIR"] = str(Path(tmp) / "tmp")
        os.mkdir(env["TMPDIR"], 0o700)
        commands = [(launcher, env)]
    else:
        port = free_port()
        commands = [([sys.executable, "-m", "distdoctor.check.rank"],
                     rank_env(env, r, nproc, port)) for r in range(nproc)]
    procs = []
    try:
        for i, (cmd, penv) in enumerate(commands):
            log = open(Path(tmp) / f"{i}.log", "wb")
            procs.append(subprocess.Popen(cmd, env=penv, stdin=subprocess.DEVNULL,
                                          stdout=log, stderr=subprocess.STDOUT,
                                          start_new_session=True))
            log.close()
        failed = _wait(procs, time.monotonic() + timeout_s, tmp)
    except OSError as exc:
        return None, f"cannot start {commands[0][0][0]!r}: {exc.strerror or exc}", ""
    finally:
        with termination_held():  # (a signal amid the stop: the ranks after ran on)
            _stop(procs)
    if failed is None and out.exists():
        try:
            return json.loads(out.read_text()), "", ""
        except ValueError as exc:
            return None, f"the ranks wrote an unreadable report ({exc})", ""
    diagnosed = _diagnose(tmp, len(procs))
    if diagnosed is not None:
        return None, diagnosed[0], diagnosed[1]
    return None, failed or "the ranks finished without a report" + _tail(tmp, 0), ""


def _diagnose(tmp: str, n: int) -> tuple[str, str] | None:
    """(the top finding of the check's own output, its remedy), or None when the log
    diagnosis finds nothing in it. One file per process: a file per rank when the check
    started them, the launcher's combined output otherwise."""
    from distdoctor.logs import scan_logs

    logs = [str(Path(tmp) / f"{i}.log") for i in range(n)
            if (Path(tmp) / f"{i}.log").is_file() and (Path(tmp) / f"{i}.log").stat().st_size]
    if not logs:
        return None
    try:
        found, _ = scan_logs(logs)
    except Exception:  # the diagnosis is a help here: never the check's own failure
        return None
    loud = [f for f in found if f.severity == "error"]
    if not loud:
        return None
    f = loud[0]
    return f"the check's ranks failed: {f.summary}", f.remedy or ""


def _wait(procs: list[subprocess.Popen], deadline: float, tmp: str) -> str | None:
    """None when every process exited 0; else what went wrong, with its output's end."""
    while time.monotonic() < deadline:
        codes = [p.poll() for p in procs]
        bad = [(i, c) for i, c in enumerate(codes) if c not in (None, 0)]
        if bad:
            i, code = bad[0]
            return f"process {i} of the check exited with code {code}{_tail(tmp, i)}"
        if all(c == 0 for c in codes):
            return None
        time.sleep(0.05)
    return ("the ranks did not finish in time (a rank that cannot reach the others waits "
            "in the rendezvous; see --timeout)")


def _tail(tmp: str, i: int) -> str:
    try:
        lines = (Path(tmp) / f"{i}.log").read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    last = next((line for line in reversed(lines) if line.strip()), "")
    return f": {last[:300]}" if last else ""


STOP_GRACE_S = 2.0  # SIGTERM to SIGKILL: torchrun removes its temp dirs on SIGTERM


def _stop(procs: list[subprocess.Popen]) -> None:
    """The check's processes and everything they started, gone: SIGTERM to each session,
    then SIGKILL to what is left after STOP_GRACE_S (SIGKILL alone left torchrun's
    torchelastic_* folders in the temp dir)."""
    running = [p for p in procs if p.poll() is None]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in running:
            try:
                os.killpg(p.pid, sig)
            except OSError:
                pass
        deadline = time.monotonic() + STOP_GRACE_S
        while running and time.monotonic() < deadline:
            running = [p for p in running if p.poll() is None]
            time.sleep(0.02)
        if not running:
            break
    for p in procs:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            pass
