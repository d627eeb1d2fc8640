"""A thread beside the step's: its collectives keep its own time, not the step's.

A background thread that all-reduces metrics on a process group of its own (created by
every rank, the right way) runs at its own cadence, and that cadence may differ per rank
(every 50 ms on one, every 80 ms on another). Its all_reduce then waits for the slowest
rank's thread every round: the thread's rhythm, not a step that came late. Counted as the
rank's step lateness it read as a straggler, or as the machine's load (issue 48, Why 7).

The rank's step thread is the user thread of its ops on the default group (the main
thread in most jobs; the one thread a framework runs the training in for some). A
collective on another group, issued from another user thread, is left out of the step's
lateness. Torch's own threads (autograd's, a checkpoint executor) carry no user thread
of their own (`thread_id` 0) and stay in: they work for the step.
"""

from __future__ import annotations

from distdoctor.diagnosis.rendezvous import Rendezvous

DEFAULT_GROUP = "0"


class StepThread:
    def __init__(self):
        self.of: dict[int, int] = {}  # rank -> the user thread of its default-group ops

    def beside(self, rv: Rendezvous) -> bool:
        """Whether the collective `rv` was issued from a user thread beside the step's
        (read from its first arrival: one program on every rank)."""
        ev = next(iter(rv.arrivals.values()))
        cs = ev.callsite
        tid = cs.get("thread_id", 0) if cs else 0
        if rv.group == DEFAULT_GROUP:
            if ev.rank not in self.of:
                self.of[ev.rank] = tid
            return False
        return bool(tid) and tid != self.of.get(ev.rank, 0)
