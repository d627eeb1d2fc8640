"""One plain group, two counter names: a counter that member-named creations advance too.

torch names a group made by `new_group()` without `use_local_synchronization` by a counter
the rank keeps (`_world.group_count`). torch 2.15 advances it on every creation, a group
named by its members (`use_local_synchronization=True`, `split_group`) included, and only
the members make those: after one, the members' counter is ahead of the other ranks', so
the next group every rank makes is "n+1" on the members and "n" on the rest, and each side
waits on store keys the other never writes (gloo at creation; NCCL at the first
collective). torch 2.13 and 2.4 give a member-named group no number, so the same program
works there; creations.py's comparison of counter-named creations sees the same places and
group_order's names stand for one member list each, so neither tells.

The rule is read from the logs, never from a version: each creation's number is its
counter name, or the count in its salted member name (sha1 of the members and the counter,
2.15; member_names.read_count reads it back). A rank whose numbers run 1, 2, 3, ... across both kinds
holds all its creations in its log and counts every creation; where such a run holds a
member-named creation next to a counter-named one, the job's torch counts them (2.13's
numbers never run on from a counter name across a member-named creation and back). What tells: two such ranks, members of
the group, that gave the k-th creation of one member list, made after as many counter-named
creations, different counter names: only the member-named creations before it differ (said
with their lines, who made them and the rank condition around them,
member_names.raised_lines). A non-member's name for it is used only by torch's store
barrier at the end of new_group, over every rank and keyed by the name, which is off by
default since 2.1: non-members' names count once a rank was seen waiting in that barrier
(`barrier`, set by the engine from Creations.after_built: the job turned it on), never
before (a healthy 2.15 job's non-members name such a group apart and it works).
"""

from __future__ import annotations

import hashlib

from distdoctor.diagnosis.hangs.creation_waits import BARRIER_WORDS
from distdoctor.diagnosis.hangs.creations import Creations, Made, counted, members_text
from distdoctor.diagnosis.hangs.member_names import (
    SHA1,
    SHOWN,
    Split,
    earlier_said,
    hung_text,
    raised_lines,
    split_evidence,
)
from distdoctor.findings import Finding, site_text, who

REASON = "group_counter_names"
REMEDY = (
    "Every rank must reach a new_group() that all ranks call after as many group creations "
    "of any kind: this torch numbers such a group by a counter that every creation "
    "advances, a group made with use_local_synchronization=True (or split_group) too, "
    "and only the members make those. Create the groups all ranks make before the "
    "member-named ones; or create the earlier groups named above without "
    "use_local_synchronization=True, on every rank in the same order; or have the other "
    "ranks make their own member-named groups at the same point, as many (a partition of "
    "the ranks, each part its group, as new_subgroups does). group_desc does not name the "
    "group: it cannot make the names agree.")


def numbered(m: Made, n: int) -> bool:
    """Whether the creation carries number `n` of its rank's counter: as its counter name,
    or in its salted member name (sha1 of the members, in the order torch joined them, and
    the count: one hash, where reading the count back would try thousands)."""
    if counted(m.name):
        return m.name == str(n)
    if not SHA1.fullmatch(m.name):
        return False
    return any(hashlib.sha1(f"{'_'.join(map(str, members))}_{n}".encode()).hexdigest()
               == m.name for members in {tuple(m.members), tuple(sorted(m.members))})


def _runs_on(seq: list[Made], start: int = 0, across: bool = False) -> tuple[bool, bool]:
    """(whole, across): the rank's creations (`seq`, in order) are numbered 1, 2, 3, ...
    (its log holds them all, every creation counted); a member-named one stands next to a
    counter-named one. From `start` on (the ones before it were found so, `across` of
    them)."""
    if not seq or not all(numbered(seq[i], i + 1) for i in range(start, len(seq))):
        return False, False
    kinds = [counted(m.name) for m in seq[max(start - 1, 0):]]
    return True, across or any(a != b for a, b in zip(kinds, kinds[1:], strict=False))


class CounterNames:
    """The counter-named creations that ranks which count every creation named apart,
    judged again on a pass after a creation was seen (a rank's run read again only after
    one of its own)."""

    def __init__(self, made: Creations):
        self.made = made
        # a rank was seen in new_group's store barrier over every rank: names of all count
        self.barrier = False
        self._seen = -1
        self._splits: list[Split] = []
        # rank -> (creations read, the newest one's event, whole, across)
        self._runs: dict[int, tuple[int, int, bool, bool]] = {}

    def splits(self) -> list[Split]:
        total = (sum(len(by) for by in self.made.by_rank.values()), self.barrier)
        if total != self._seen:
            self._seen = total
            ranks, across = [], False
            for r, by in self.made.by_rank.items():
                n, last, whole, mixed = self._runs.get(r, (0, -1, True, False))
                if n != len(by):
                    seq = [by[i] for i in sorted(by)]
                    if not n or seq[n - 1].index != last:  # one came before those read
                        whole, mixed = _runs_on(seq)
                    elif whole:  # only newer ones: read those
                        whole, mixed = _runs_on(seq, n, mixed)
                    self._runs[r] = (len(seq), seq[-1].index, whole, mixed)
                if whole:
                    ranks.append(r)
                    across |= mixed
            # nothing shows that this torch numbers member-named creations: none compared
            self._splits = (_splits(self.made, sorted(ranks), self.barrier) if across
                            else [])
        return self._splits

    def names(self) -> list[str]:
        return [name for s in self.splits() for name, _ in s.sides]


def _splits(made: Creations, ranks: list[int], barrier: bool = False) -> list[Split]:
    """The k-th creations of one member list that `ranks` (whose logs hold all their
    creations, each counted) made after as many counter-named ones and named apart, by
    its members: only they wait on the group's store keys, the others' names for it are
    never used (torch gives them a placeholder group), so a non-member whose counter is
    ahead changes nothing (a healthy 2.15 job: ranks 0, 1 make a member-named pair, then
    all call new_group([2, 3]): "2" on 0, 1 and "1" on 2, 3, and it works). With the
    `barrier` on, by every rank: each waits there on the key of its own name."""
    # (members, k) -> member rank -> (counter-named creations before it, it)
    items: dict[tuple, dict[int, tuple[int, Made]]] = {}
    for r in ranks:
        seen: dict[tuple, int] = {}
        for place, m in enumerate(made.order(r)):
            key = tuple(sorted(m.members))
            k = seen[key] = seen.get(key, -1) + 1
            if barrier or r in key:
                items.setdefault((key, k), {})[r] = (place, m)
    out = []
    for (members, _), by in sorted(items.items()):
        for place in sorted({p for p, _ in by.values()}):
            sides: dict[str, list[int]] = {}
            for r, (p, m) in sorted(by.items()):
                if p == place:  # another place: a rank that skipped one (group_order.py)
                    sides.setdefault(m.name, []).append(r)
            if len(sides) > 1:
                kept = sorted(sides.items(), key=lambda s: (-len(s[1]), s[1]))
                out.append(Split(members, kept, {r: by[r][1] for _, rs in kept for r in rs}))
    return out


def counter_names_finding(made: Creations, splits: list[Split], positions: dict[int, tuple],
                          hangs: list[Finding], world: set[int], stuck_inside: bool,
                          guard_of) -> Finding:
    """The finding for counter-named creations named apart (`splits`, one cause: the first
    said in full, the others in short); the arguments as member_names_finding's."""
    world = set(world) | {r for s in splits for r in s.made}
    first = splits[0]
    m0 = next(iter(first.made.values()))
    named = ", ".join(f"{who(rs)} named it {name}" for name, rs in first.sides[:SHOWN])
    summary = (f"group {members_text(first.members)} (new_group at "
               f"{site_text(m0.callsite) or 'an unknown line'}, which every rank calls) has "
               f"more than one name: {named}, so its ranks wait on different store keys "
               "(this torch numbers such a group by a counter that every group creation "
               "advances, also one made by its members alone with "
               "use_local_synchronization=True)")
    outside = sorted(r for _, rs in first.sides for r in rs if r not in first.members)
    if outside:  # only where the barrier is on (CounterNames.barrier)
        summary += (f"; {who(outside)}, no member{'s' if len(outside) > 1 else ''} of it, "
                    f"wait{'' if len(outside) > 1 else 's'} on its name too: {BARRIER_WORDS}")
    said, details_earlier, branch = earlier_said(made, first, "created", world, guard_of)
    if said:
        summary += "; the counters differ because of the groups made before it: " + "; ".join(
            said)
    for s in splits[1:SHOWN]:
        summary += f"; also {members_text(s.members)}: " + ", ".join(
            f"{who(rs)} named it {name}" for name, rs in s.sides)
    stuck = stuck_inside or any(f.kind in ("hang", "deadlock") for f in hangs)
    if stuck:
        summary = hung_text(summary, positions)
    culprits, tie = _culprits(made, splits)
    details = {"reason": REASON, "group_name": first.sides[0][0],
               "members": list(first.members[:64]), "counted": "created",
               "names": [{"name": n, "ranks": rs[:64]} for n, rs in first.sides],
               "earlier": details_earlier,
               "where": {str(r): p[0] for r, p in sorted(positions.items())}}
    if outside:
        details["barrier"] = True
    sites, stacks = split_evidence(made, splits, lambda s: "created", hangs, details, branch,
                                   tie or not culprits)
    return Finding("hang" if stuck else "mismatch", "error", summary, culprits,
                   first.sides[0][0], None, sites, stacks, details, REMEDY)


def _culprits(made: Creations, splits: list[Split]) -> tuple[list[int], bool]:
    """(ranks, tie): the ranks whose counter the earlier member-named creations raised
    (they made groups the others did not: a majority says nothing here, no rank skipped a
    call torch asks of it); a tie where the earlier creations raised each side somewhere."""
    odd: set[int] = set()
    tie = False
    for s in splits:
        raised = {e["more_on"] for e in raised_lines(made, s, "created")}
        sides = [rs for _, rs in s.sides if raised & set(rs)]
        if len(sides) == 1:
            odd |= set(sides[0])
        else:
            tie = True
    return sorted(odd), tie and not odd
