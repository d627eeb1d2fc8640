"""The live loop's CPU budget, for `run`'s whole process.

After a pass that took `c` seconds of the loop thread's CPU, the next waits at least
c / (share - others), where `others` is what the process's other threads (the probe
sampler, the output relays, the main loop, a metrics server) used of a core since the
last pass, and never less than a quarter of the share is left to the loop (OWN_FLOOR). A budget of the loop thread alone let the process exceed it by those threads
(2 ranks x 1,000 collectives/s: the loop at its 1%, `run` at 1.06-1.12%). A busy job gets
fewer, larger passes; a pass never waits longer than `max_wait_s`, so a job whose events
cost more than the budget to follow is followed at that pace, over budget, rather than
fallen behind.
"""

from __future__ import annotations

import time

# The loop's own part never falls below this share of the budget: a forwarder or a
# metrics server busy at the whole budget would otherwise leave it none, and every pass
# would wait the longest (a finding up to 2 s later, however cheap the passes); with a
# quarter, a pass's CPU is spread over at most 4 times the time it is alone.
OWN_FLOOR = 0.25


class PassBudget:
    def __init__(self, share: float, min_wait_s: float, max_wait_s: float):
        self.share = share
        self.min_wait_s = min_wait_s
        self.max_wait_s = max_wait_s
        self.others = 0.0  # the other threads' share of a core (smoothed over passes)
        self._measured = False
        self._mark = self._clocks()
        self._pass_cpu = time.thread_time()

    @staticmethod
    def _clocks() -> tuple[float, float, float]:
        return time.process_time(), time.thread_time(), time.monotonic()

    def begin(self) -> None:
        """A pass begins (on the loop's thread)."""
        self._pass_cpu = time.thread_time()

    def wait(self) -> float:
        """After a pass (on the loop's thread): how long until the next."""
        process, thread, wall = self._clocks()
        pass_cpu = thread - self._pass_cpu
        process0, thread0, wall0 = self._mark
        if self._measured and wall > wall0:
            seen = max(0.0, (process - process0) - (thread - thread0)) / (wall - wall0)
            # halved each pass: the sampler's tick (1 Hz) falls in some passes' time only
            self.others = (self.others + seen) / 2
        # (not over the first pass: the launcher starting the job is not what runs beside it)
        self._measured = True
        self._mark = process, thread, wall
        left = max(self.share - self.others, self.share * OWN_FLOOR)
        spread = pass_cpu / left
        return min(self.max_wait_s, max(self.min_wait_s, spread))
