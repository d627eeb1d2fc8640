"""A reader of a run dir at the job's pace: which parts of a pass are worth doing.

A pass in which nothing changed (no event, no new or closed log, no line of output, no
exit) reads each rank's log header and stops there. What moves with time alone (the
ranks' heartbeats and pids, their progress, the detectors' clocks: hangs, long waits) is
looked at every SLOW_S: a hang is found a fraction of a second later, and an idle job
costs its follower little (a full pass of the live diagnosis took ~0.7 ms at 2 ranks, and
ran 4 times a second whatever the job did).
"""

from __future__ import annotations

import math

SLOW_S = 0.5


class Pace:
    def __init__(self, slow_s: float = SLOW_S):
        self.slow_s = slow_s
        self._slow_at = -math.inf  # when the time-driven checks last ran
        self._exits = None  # the launcher's exits as of the last pass

    def plan(self, now_s: float, forced: bool, exits, changed: bool) -> bool | None:
        """True: the time-driven checks are due (or `forced`: a last or one-off pass, a log
        that appeared or closed); False: only what changed is; None: nothing is, the pass
        stops. `exits`: the launcher's exits now (a new one is news); `changed`: the
        follower or the job's output brought something."""
        due = forced or not 0 <= now_s - self._slow_at < self.slow_s
        if due:
            self._slow_at = now_s
        changed = changed or exits != self._exits
        self._exits = exits
        return True if due else (False if changed else None)
