"""Real CPU hogs for the tests of the machine's noise: processes that spin on given cores
(other processes than the job's: children of the test, not of a rank), stopped on exit."""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys

SPIN = """
import os, sys, time
if sys.argv[3]:  # the name ps, top and psutil show (a distinct one a test can look for)
    with open("/proc/self/comm", "w") as f:
        f.write(sys.argv[3])
if sys.argv[1] != "any":
    os.sched_setaffinity(0, {int(sys.argv[1])})
duty = float(sys.argv[2])
while True:
    if duty >= 1:
        continue
    t = time.monotonic()
    while time.monotonic() - t < 0.01 * duty:  # spin this share of every 10 ms
        pass
    time.sleep(0.01 * (1 - duty))
"""


@contextlib.contextmanager
def cpu_hogs(cores: list, duty: float = 1.0, name: str = "", detached: bool = False):
    """One spinning process per entry of `cores` (a core number, or "any": unpinned),
    each busy `duty` of the time (1: all of it), named `name` (<= 15 characters) if
    given; yields their pids. `detached`: started through a shell that exits at once, so
    they descend from no process of the caller's (a probe in this process would take
    its own children for the job's)."""
    if detached:
        spawn = "; ".join(shlex.join([sys.executable, "-c", SPIN, str(c), str(duty), name])
                          + " >/dev/null 2>&1 & echo $!" for c in cores)
        out = subprocess.run(["sh", "-c", spawn], capture_output=True, text=True, check=True)
        pids = [int(x) for x in out.stdout.split()]
        try:
            yield pids
        finally:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        return
    procs = [subprocess.Popen([sys.executable, "-c", SPIN, str(c), str(duty), name])
             for c in cores]
    try:
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()
