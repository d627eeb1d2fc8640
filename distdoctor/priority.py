"""distdoctor's own threads yield the CPU to the job they watch.

`distdoctor run` shares the node's cores with the ranks. Its background threads (the live
diagnosis loop, the probes sampler) lower their own scheduling priority, so on a node
whose cores the ranks fill, a rank never waits for distdoctor's work; the diagnosis may
lag by a pass instead. Linux schedules threads, and its nice value is per thread, so this
leaves the launcher's main thread (which relays the ranks' output) and any process it
starts as they were.
"""

from __future__ import annotations

import os
import threading

BACKGROUND_NICENESS = 10  # CFS weight 110 against a rank's 1024: ~1/10 of a contended core


def lower_this_thread(niceness: int = BACKGROUND_NICENESS) -> bool:
    """Raise the calling thread's nice value by `niceness` (never lowers it). False where
    the platform has no per-thread priority or refuses it."""
    try:
        tid = threading.get_native_id()
        current = os.getpriority(os.PRIO_PROCESS, tid)
        os.setpriority(os.PRIO_PROCESS, tid, min(19, current + niceness))
        return True
    except (AttributeError, OSError):
        return False
