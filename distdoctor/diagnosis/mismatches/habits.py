"""What agreeing ranks usually do on a group: its (op, line) pairs, learnt from the
collectives where every rank agreed. A rank that departs from them is the likelier
culprit when a mismatch's vote ties (mismatch.py), and a hang on a familiar line is less
likely a rank's own (hangs.py).

A sample, not a census: a loop repeats its lines, so a group's first ALL_FIRST agreeing
rendezvous are all learnt from and then one in EVERY (looking at each of a thousand a
second was a twentieth of the live diagnosis), and at most MAX_HABITS pairs a group.
"""

from __future__ import annotations

from itertools import islice

from distdoctor.diagnosis.mismatches.mismatch import habit
from distdoctor.diagnosis.rendezvous import Rendezvous

MAX_HABITS = 256  # (op, line) pairs remembered per group
ALL_FIRST = 64  # a group's agreeing rendezvous that are all learnt from
EVERY = 16  # ... and after those, one in this many
PER_RENDEZVOUS = 8  # arrivals looked at in one (agreeing ranks mostly share lines)


class Habits:
    def __init__(self):
        self.of: dict[str, set] = {}  # group -> habit()s
        self._count: dict[str, int] = {}  # group -> its agreeing rendezvous so far

    def agreed(self, rv: Rendezvous) -> None:
        """A rendezvous of a collective whose ranks all agreed."""
        n = self._count.get(rv.group, 0) + 1
        self._count[rv.group] = n
        if n > ALL_FIRST and n % EVERY:
            return
        habits = self.of.get(rv.group)
        if habits is None:
            habits = self.of[rv.group] = set()
        if len(habits) < MAX_HABITS:
            habits.update(map(habit, islice(rv.arrivals.values(), PER_RENDEZVOUS)))

    def on(self, group: str) -> set:
        return self.of.get(group, set())

    def familiar(self, ev) -> bool | None:
        """Whether a call like `ev` (op and line) was seen on its group where every rank
        agreed; None while no collective of the group has (nothing to compare it with)."""
        habits = self.of.get(ev.group)
        return None if habits is None else habit(ev) in habits
