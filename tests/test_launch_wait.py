"""`distdoctor run`'s supervision loop sleeps between its looks at the job, and a process's
exit wakes it (a pidfd per process): an idle job costs run ~2 looks a second, not 10, and
an exit is seen at once. Real processes; a kernel without pidfds looks as before.

The loop runs in a process of its own: Job.start makes its process the subreaper of the
job's orphans for good, which would make every later test's detached process this one's."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

LOOP = """
import json, os, sys, time
from distdoctor.launch.local import Job
sleeper = lambda s: [sys.executable, "-c", f"import time; time.sleep({s})"]
fds_before = len(os.listdir("/proc/self/fd"))
job = Job.start([(0, sleeper(0.3), dict(os.environ)), (1, sleeper(0.8), dict(os.environ))],
                grace_s=2.0)
if sys.argv[1] == "fallback":
    job._pidfds = None  # as on a kernel without them
looks, start = 0, time.monotonic()
try:
    while job.poll():
        looks += 1
        job.wait(10.0)  # an exit, not this, ends each wait
    took = time.monotonic() - start
finally:
    job.close()
print(json.dumps({"codes": [p.exit_code for p in job.procs], "took": took, "looks": looks,
                  "fds_left": len(os.listdir("/proc/self/fd")) - fds_before}))
"""


@pytest.mark.timeout(60)
@pytest.mark.parametrize("how", ["pidfds", "fallback"])
def test_the_loop_wakes_at_each_exit_and_leaves_no_fd(how):
    if how == "pidfds" and not hasattr(os, "pidfd_open"):
        pytest.skip("no pidfds on this platform")
    out = subprocess.run([sys.executable, "-c", LOOP, how], capture_output=True, text=True,
                         timeout=50)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["codes"] == [0, 0], got
    assert got["took"] < 8.0, got  # a wait that missed the exits would take 10 s each
    assert got["looks"] <= (4 if how == "pidfds" else 200), got  # one per exit, and the first
    assert got["fds_left"] == 0, got  # every pidfd closed
