"""What each rank created: the process groups in the order the rank made them.

The tracer writes one implicit span per group creation (tracer/groups.py), on every rank
that takes part, member or not, with the new group's name and members. torch names a group
made by `new_group()` by a per-rank counter ("1", "2", ...), so in a right program every
rank's list of counter-named creations is the same list (a rank behind the others holds a
prefix of it). Two lists that differ say which rank created which group where, and which
never did; a creation that never ends while a member of it is elsewhere says why a job
hangs though no traced op disagrees. Groups named by their members
(`use_local_synchronization=True`, `split_group`) are created by their members alone, which
is legal: only counter names are compared here (member_names.py compares those names
between the members).
"""

from __future__ import annotations

from dataclasses import dataclass

from distdoctor.findings import site_text, who
from distdoctor.runlog import format as F

MAX_PER_RANK = 1024  # creations kept per rank (a job makes a few, a mesh some hundreds)
MAX_RANKS = 65536
SHOWN_ORDERS = 4  # distinct creation orders written into a summary
SHOWN_STEPS = 4  # creations shown per order
# sampled on a creation's line this long after its group was built: in new_group's barrier
# (building returns at once when no barrier follows; a slow return is milliseconds)
BARRIER_S = 1.0


@dataclass
class Made:
    """One group creation on one rank."""

    index: int  # the event's number in the rank's log (the order the rank made them)
    name: str
    members: tuple[int, ...]
    callsite: dict | None
    t_enter_ns: int
    t_end_ns: int | None  # None: the rank is still inside the call
    failed: bool = False


def is_creation(ev) -> bool:
    return ev.kind == "span" and ev.implicit and ev.name == F.SPAN_NEW_GROUP


def counted(name: str) -> bool:
    """A name torch gave by its counter (not a hash of the members, not a user's name)."""
    return name.isdigit()


def counter_order(name: str) -> tuple[int, str]:
    """A counter name's order as a number, without int() (a log's name may be 5,000
    digits long)."""
    digits = name.lstrip("0") or "0"
    return len(digits), digits


class Creations:
    def __init__(self):
        self.by_rank: dict[int, dict[int, Made]] = {}
        # rank -> the number of its first event that was read (0: its log from its start)
        self.first: dict[int, int] = {}
        self.newest: dict[int, int] = {}  # rank -> the number of its newest creation
        # (name, sorted members) -> the ranks that began a creation of it (asked for each
        # rank a creation waits for, on every pass while one does)
        self.makers: dict[tuple[str, tuple[int, ...]], set[int]] = {}

    def began(self, rank: int, index: int) -> None:
        """The first event of `rank` that was read (the engine's, of any kind: a sample or
        a collective as often as a creation). Readers take a rank's events in their order,
        so a number past 0 means the oldest were gone when it was first read: its ring had
        wrapped (a long job read post-mortem), or a viewer joined late (`watch`'s backlog)."""
        if rank not in self.first and len(self.first) < MAX_RANKS:
            self.first[rank] = index

    def see(self, ev) -> Made | None:
        """Take a creation span (its start, or its end: the same event number)."""
        made = self.by_rank.get(ev.rank)
        if made is None:
            if len(self.by_rank) >= MAX_RANKS:
                return None
            made = self.by_rank[ev.rank] = {}
        old = made.get(ev.index)
        if old is None and len(made) >= MAX_PER_RANK:
            return None
        m = made[ev.index] = Made(ev.index, ev.group, tuple(ev.group_ranks), ev.callsite,
                                  ev.t_enter_ns, ev.t_end_ns, ev.status not in ("ok",
                                                                                "in_flight"))
        if ev.index >= self.newest.get(ev.rank, -1):
            self.newest[ev.rank] = ev.index
        self.makers.setdefault((m.name, tuple(sorted(m.members))), set()).add(ev.rank)
        return m

    def order(self, rank: int) -> list[Made]:
        """The rank's counter-named creations, in the order it made them."""
        made = self.by_rank.get(rank, {})
        return [made[i] for i in sorted(made) if counted(made[i].name)]

    def inside(self, rank: int) -> Made | None:
        """The creation the rank is inside now, if any."""
        made = self.by_rank.get(rank)
        if not made:
            return None
        newest = made[self.newest[rank]]
        return newest if newest.t_end_ns is None and not newest.failed else None

    def after_built(self, rank: int, latest_op: int | None, sampled: tuple | None,
                    seen_ns: int | None) -> Made | None:
        """The creation `rank` still stands in after torch built its group: its newest
        event is that creation (`latest_op`: the number of its newest op), ended, and its
        sampler saw it since, BARRIER_S or more later, still on the line that made it
        (`sampled`: its newest sampled (file, line), taken at `seen_ns` of its clock):
        the rank has not returned from new_group. With TORCH_DIST_INIT_BARRIER=1 torch
        ends new_group with a store barrier (creation_waits.py); without it, nothing
        there waits."""
        made = self.by_rank.get(rank)
        if not made or sampled is None or seen_ns is None:
            return None
        m = made[self.newest[rank]]
        if (m.t_end_ns is None or m.failed or (latest_op is not None and latest_op > m.index)
                or tuple(sampled[:2]) != _line(m) or seen_ns - m.t_end_ns < BARRIER_S * 1e9):
            return None
        return m

    def whole(self, world: set[int]) -> set[int]:
        """The ranks of `world` whose log holds every creation they made: it was read from
        its first event on. One whose oldest events were gone may have lost creations with
        them, and would look as if it skipped those. Never told from the names: torch 2.15
        numbers a member-named creation too, so a rank that made one first starts its
        counter names at "2" while others start at "1", all of them whole. A rank none of
        whose events was read made none that anyone saw: whole (it skipped them)."""
        return {r for r in world if not self.first.get(r, 0)}

    def items(self) -> dict[tuple, dict[int, tuple[int, Made]]]:
        """Each group creation as the ranks should all make it: (members, how many groups of
        those members the rank made before) -> {rank: (its place in the rank's order, it)},
        over the ranks whose log holds all they made. The same members twice (a TP and a DP
        group over one pair) are two items."""
        out: dict[tuple, dict[int, tuple[int, Made]]] = {}
        for rank in self.whole(set(self.by_rank)):
            seen: dict[tuple, int] = {}
            for place, m in enumerate(self.order(rank)):
                members = tuple(sorted(m.members))
                k = seen[members] = seen.get(members, -1) + 1
                out.setdefault((members, k), {})[rank] = (place, m)
        return out

    def partial(self, world: set[int]) -> list[tuple[tuple, dict[int, tuple[int, Made]]]]:
        """The items that some ranks of `world` made and others did not, in order."""
        world = self.whole(world)
        return sorted(((item, by) for item, by in self.items().items()
                       if not set(by) >= world), key=lambda pair: pair[0])

    def missing(self, m: Made, world: set[int]) -> list[int]:
        """The ranks of `world` that never began creating `m`'s group under its name."""
        return sorted(r for r in world if not any(
            x.name == m.name and sorted(x.members) == sorted(m.members)
            for x in self.order(r)))

    def culprits(self, world: set[int], guarded) -> tuple[list[int], bool]:
        """(the ranks whose creations part from the majority's, tie): a creation most ranks
        made at another place of their order than these did; one that most ranks made and
        these did not (they skipped it); one that few made (its makers made an extra one).
        An even split is a tie, broken by the program where `guarded(m)` says the creation
        stands in an arm of a condition on the rank's identity: the ranks that made the
        guarded call."""
        odd: set[int] = set()
        tie = False
        world = self.whole(world)
        for by in self.items().values():
            places: dict[int, int] = {}
            for place, _ in by.values():
                places[place] = places.get(place, 0) + 1
            top = max(places, key=places.get)
            if len(places) > 1 and 2 * places[top] > len(by):
                odd |= {r for r, (place, _) in by.items() if place != top}
            made_by = set(by)
            if made_by >= world:
                continue
            if 2 * len(made_by) > len(world):
                odd |= world - made_by
            elif 2 * len(made_by) < len(world):
                odd |= made_by
            elif guarded(by[min(by)][1]):
                odd |= made_by
            else:
                tie = True
        if odd >= world:  # every rank parted from the others somewhere: nobody is odd
            return [], True
        return sorted(odd), tie and not odd

    def orders(self, ranks) -> list[tuple[list[int], list[Made]]]:
        """The ranks grouped by the order of what they created (same lists and lines)."""
        by: dict[tuple, tuple[list[int], list[Made]]] = {}
        for r in sorted(ranks):
            seq = self.order(r)
            key = tuple((tuple(sorted(m.members)), _line(m)) for m in seq)
            by.setdefault(key, ([], seq))[0].append(r)
        return sorted(by.values(), key=lambda v: (-len(v[0]), v[0]))

    def orders_text(self, ranks) -> str:
        """"ranks 0, 1 created [0, 1] at job.py:25, then [2, 3] at job.py:26; rank 2
        created [2, 3] at job.py:28 (still inside it)"."""
        parts = []
        for rs, seq in self.orders(ranks)[:SHOWN_ORDERS]:
            if not seq:
                parts.append(f"{who(rs)} created none")
                continue
            steps = [f"{members_text(m.members)} at "
                     f"{site_text(m.callsite) or 'an unknown line'}"
                     + (" (still inside it)" if m.t_end_ns is None and not m.failed else "")
                     for m in seq[:SHOWN_STEPS]]
            more = f", and {len(seq) - SHOWN_STEPS} more" if len(seq) > SHOWN_STEPS else ""
            parts.append(f"{who(rs)} created {', then '.join(steps)}{more}")
        return "; ".join(parts)

    def details(self, ranks) -> list[dict]:
        return [{"ranks": rs[:64], "created": [
            {"group": m.name, "members": list(m.members[:64]), "file": (m.callsite or {})
             .get("file"), "line": (m.callsite or {}).get("line"),
             "done": m.t_end_ns is not None} for m in seq[:32]]}
            for rs, seq in self.orders(ranks)[:16]]


def members_text(members) -> str:
    members = sorted(members)
    shown = ", ".join(map(str, members[:8]))
    return f"[{shown}{', ...' if len(members) > 8 else ''}]"


def unique_sites(sites: list[dict]) -> list[dict]:
    """The call sites, each (rank, file, line) once, in their order."""
    seen, out = set(), []
    for cs in sites:
        key = (cs.get("rank"), cs.get("file"), cs.get("line"))
        if key not in seen:
            seen.add(key)
            out.append(cs)
    return out


def _line(m: Made) -> tuple:
    cs = m.callsite or {}
    return cs.get("file"), cs.get("line")
