"""`distdoctor run`'s supervision loop sleeps between its looks at the job, and a process's
exit wakes it (a pidfd per process): an idle job costs run ~2 looks a second, not 10, and
an exit is seen at once. Real processes; a kernel without pidfds looks as before."""

from __future__ import annotations

import os
import sys
import time

import pytest

from distdoctor.launch.local import Job


def _sleeper(seconds: float) -> list[str]:
    return [sys.executable, "-c", f"import time; time.sleep({seconds})"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("pidfds", [True, False])
def test_the_loop_wakes_at_each_exit_and_leaves_no_fd(pidfds):
    if pidfds and not hasattr(os, "pidfd_open"):
        pytest.skip("no pidfds on this platform")
    fds_before = len(os.listdir("/proc/self/fd"))
    job = Job.start([(0, _sleeper(0.3), dict(os.environ)), (1, _sleeper(0.8), dict(os.environ))],
                    grace_s=2.0)
    if not pidfds:
        job._pidfds = None  # as on a kernel without them
    looks, start = 0, time.monotonic()
    try:
        while job.poll():
            looks += 1
            job.wait(10.0)  # an exit, not this, ends each wait
        took = time.monotonic() - start
    finally:
        job.close()
    assert [p.exit_code for p in job.procs] == [0, 0]
    assert took < 8.0, took  # a wait that missed the exits would take 10 s each
    assert looks <= (4 if pidfds else 200), looks  # pidfds: one per exit, and the first
    assert len(os.listdir("/proc/self/fd")) == fds_before  # every pidfd closed
