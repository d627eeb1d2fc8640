"""Real CPU hogs for the tests of the machine's noise: processes that spin on given cores
(other processes than the job's: children of the test, not of a rank), stopped on exit."""

from __future__ import annotations

import contextlib
import subprocess
import sys

SPIN = """
import os, sys
if sys.argv[1] != "any":
    os.sched_setaffinity(0, {int(sys.argv[1])})
while True:
    pass
"""


@contextlib.contextmanager
def cpu_hogs(cores: list):
    """One spinning process per entry of `cores` (a core number, or "any": unpinned);
    yields their pids."""
    procs = [subprocess.Popen([sys.executable, "-c", SPIN, str(c)]) for c in cores]
    try:
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()
