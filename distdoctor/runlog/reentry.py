"""The rank's log writers, never re-entered on one thread.

A job's signal handler runs on the main thread between any two bytecodes, inside
distdoctor's code too. A handler that issues a collective (a preemption handler's
barrier, a checkpoint on SIGUSR1) or leaves through os._exit (whose status and line the
tracer writes) enters the writers again while the main thread may hold one of their
plain locks: the string table's (ring.py, `add_string`), the ring's wake-up
(`_near_end`), the source keeper's queue (sources.py, `note`). The second entry then
waited for ever on the first, which cannot go on until the handler returns: a rank
whose timer's handler issued all_reduce hung within a second (bare: 20,000 ops in 3 s).

Re-entered, a writer does nothing and says so as it does for a full table: no string
(id 0; the op is recorded without it, and the next op that needs it adds it), no
wake-up (the interrupted call gives it), no source kept.
"""

from __future__ import annotations

import threading


class _Inside(threading.local):
    now = False


_inside = _Inside()


def enter() -> bool:
    """This thread is inside a writer now; False (and nothing to leave) where it was
    already. A handler that runs between the look and the mark finds it outside and is
    done before the interrupted call goes on: no order of the two takes a lock twice."""
    if _inside.now:
        return False
    _inside.now = True
    return True


def leave() -> None:
    _inside.now = False
