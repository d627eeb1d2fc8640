"""Run `distdoctor ARGS...` in a child and read the child's own peak resident memory.

The child reads its peak itself (VmHWM of /proc/self/status, its own address space) at
exit. wait4's ru_maxrss cannot be used: Linux carries the forking parent's resident pages
(pytest's, hundreds of MB in a full suite) into the child's peak before the exec, so a
154 MB diagnose read 487 MB in the suite and 552 MB failed a 512 MB bound in CI.
"""

from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# `distdoctor ARGS...` run in this process, its peak resident memory (kB) written to argv[1]
_PEAK_OF_DISTDOCTOR = """
import atexit, re, runpy, sys
peak_path = sys.argv.pop(1)
def _peak():
    with open("/proc/self/status") as fh:
        kb = re.search(r"VmHWM:\\s*(\\d+)", fh.read()).group(1)
    with open(peak_path, "w") as fh:
        fh.write(kb)
atexit.register(_peak)
sys.argv[0] = "distdoctor"
runpy.run_module("distdoctor", run_name="__main__", alter_sys=True)
"""


@dataclass
class Measured:
    code: int
    out: str
    err: str
    took_s: float
    peak_mb: float


def run_measured(args: list[str], folder: Path, timeout_s: float,
                 read_out: bool = True) -> Measured:
    """Run distdoctor with ARGS (stdout and stderr to files in FOLDER, so a large answer
    cannot fill a pipe); killed after TIMEOUT_S, which fails the caller's test. Without
    `read_out`, stdout stays in FOLDER/measured.out, unread (a job's 100 MB)."""
    out, err, peak = folder / "measured.out", folder / "measured.err", folder / "measured.peak"
    cmd = [sys.executable, "-c", _PEAK_OF_DISTDOCTOR, str(peak), *args]
    start = time.monotonic()
    with open(out, "w") as fo, open(err, "w") as fe:
        proc = subprocess.Popen(cmd, stdout=fo, stderr=fe, stdin=subprocess.DEVNULL, cwd=ROOT)
    try:
        code = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"distdoctor {' '.join(args)}: stopped after {timeout_s} s") from None
    finally:
        proc.kill()
        proc.wait()
    took = time.monotonic() - start
    peak_mb = int(peak.read_text()) / 1024 if peak.exists() else float("nan")
    return Measured(code, out.read_text() if read_out else "", err.read_text(), took, peak_mb)
