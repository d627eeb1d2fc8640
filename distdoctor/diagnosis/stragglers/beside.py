"""A thread beside the step's: its collectives keep its own time, not the step's.

A background thread that all-reduces metrics on a process group of its own (created by
every rank, the right way) runs at its own cadence, and that cadence may differ per rank
(every 50 ms on one, every 80 ms on another). Its all_reduce then waits for the slowest
rank's thread every round: the thread's rhythm, not a step that came late. Counted as the
rank's step lateness it read as a straggler, or as the machine's load; counted in the
rank's pattern of collectives it broke the pattern, and a job without spans had a step
per 64 collectives, 7-12 steps in 80 (issue 48, Why 7).

One rule, read in each rank's own order of collectives (the engine's ingest) and used by
both the step detection (steptime.py) and the step lateness (straggler.py):
- the rank's step thread issues its training collectives: the main thread once it has
  issued one (torch's own threads, autograd's or a checkpoint executor's, carry no user
  thread, `thread_id` 0, and count as the main thread: they work for the step); before
  that, the user thread of its default-group ops (a framework that trains in a thread).
  The rank's pattern of collectives is found anew when it changes (steptime.py): a
  thread started before the loop may all-reduce for seconds before the first step;
- a collective is beside the step when a user thread other than the step thread issued
  it, on a group that no other thread of the rank has used. That holds for a thread on a
  group of its own (before any step thread is known too), and for a thread on the
  default group while training uses only subgroups: each group still has one thread, so
  its order is defined (torch's rule).
  Two threads on one group (training and the thread both on the default group) are the
  bug mismatches/threads.py says; their collectives stay the step's.
"""

from __future__ import annotations

from collections import OrderedDict

DEFAULT_GROUP = "0"
MAIN = 0  # the main thread's `thread_id` (and torch's threads')
SHARED = -1  # a group that more than one thread of the rank used
MAX_GROUPS = 4096  # (rank, group) pairs followed; past this, ops count as the step's
MAX_FLAGGED = 65_536  # ops beside the step awaiting their rendezvous


class StepThread:
    def __init__(self):
        self.of: dict[int, int] = {}  # rank -> its step thread
        self.users: dict[tuple, int] = {}  # (rank, group) -> its one thread, or SHARED
        self.seen: dict[int, int] = {}  # rank -> the last event index fed
        self.flagged: OrderedDict = OrderedDict()  # (rank, event index) of ops beside it

    def op(self, ev) -> bool:
        """A new collective of a rank, in its own order (each once): whether it is beside
        the rank's step (and then remembered until its rendezvous is judged)."""
        rank = ev.rank
        self.seen[rank] = ev.index
        cs = ev.callsite
        tid = cs.get("thread_id", MAIN) if cs else MAIN
        key = (rank, ev.group)
        users = self.users.get(key)
        if users != tid and users != SHARED:  # (the common case: one thread, known)
            if users is not None:
                users = self.users[key] = SHARED
            elif len(self.users) < MAX_GROUPS:
                users = self.users[key] = tid
            else:
                return False
        if tid == MAIN:
            if self.of.get(rank) != MAIN:
                self.of[rank] = MAIN
            return False
        step = self.of.get(rank)
        if step is None and ev.group == DEFAULT_GROUP:
            step = self.of[rank] = tid  # (until the main thread issues one)
        if tid == step or users != tid:
            return False
        flagged = self.flagged
        flagged[(rank, ev.index)] = True
        if len(flagged) > MAX_FLAGGED:
            flagged.popitem(last=False)
        return True

    def beside(self, rv) -> bool:
        """Whether the completed collective `rv` was issued beside the step on some rank
        (each member's op is read where it was fed; one a tracker was handed directly,
        with no feed, is read here)."""
        out = False
        seen, flagged = self.seen, self.flagged
        for r, ev in rv.arrivals.items():
            if ev.index > seen.get(r, -1):
                self.op(ev)
            if flagged and flagged.pop((r, ev.index), None):
                out = True
        return out
