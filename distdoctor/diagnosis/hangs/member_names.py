"""One group, several names: a group named by its members that its members name differently.

`new_group(..., use_local_synchronization=True)` (and `split_group`) is called by the
group's members alone, and torch names the group from its members and a count the rank
keeps for itself: torch 2.13 hashes the members with the number of groups the rank is a
member of (`len(_world.pg_names)`), 2.15 with the groups it has created
(`_world.group_count`, which only the members of a member-named group advance), 2.4 hashes
the members and hashes again for each group of the same members the rank holds. Where an
earlier group was made, or joined, by some of the members only, their counts differ: they
give one group different names, and its store rendezvous (gloo's, at creation; NCCL's, at
the first collective) waits on keys the other members never write. No group name stands
for two member lists here, so group_order's test never sees it.

What tells: two members whose newest creation of one member list carries names the other
never used, both still inside it (or both done with as many creations of it: a ring that
lost old creations leaves fewer). The count each rank used is read back from the name by
recomputing torch's hashes for each recipe and count up to a bound (the recipe is
recognised, never assumed from a version), and the rank's earlier creations in the log say
what the count counted, so the earlier groups only some of the members made or joined are
named, with the rank condition around them. Not told: a name the other member gave before
(2.4 hashes a destroyed group's name again on the rank that destroyed it alone), which reads
as a member behind the other.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from functools import lru_cache

from distdoctor.diagnosis.hangs.creations import (
    Creations,
    Made,
    counted,
    members_text,
    unique_sites,
)
from distdoctor.findings import Finding, site_text, who

MAX_LISTS = 4096  # member lists followed (a job has a few; past this, none is added)
MAX_SIDE = 64  # ranks of one name compared with the ranks of another
# counts tried per recipe when a name is read back (~30 ms for a name of no recipe, once);
# a rank past it (2.15 counts every group it created) is said without its count
MAX_COUNT = 1 << 14
SHOWN = 4  # earlier creations and further groups said in a summary
SHA1 = re.compile(r"[0-9a-f]{40}")
REASON = "group_member_names"
# what each way of counting counts, in words
COUNTS = {"member": "the number of groups the rank was a member of, the default one included",
          "created": "the number of groups the rank had created, the default one included",
          "both": "the number of groups the rank had made, the default one included",
          "chained": "the number of groups of these members the rank held"}
# what to try, by the way the count was counted (a rank's count must equal its members')
SAME = "Give a member-named group the same count on all its members: "
REMEDIES = {
    "member": SAME + "create it without use_local_synchronization=True (every rank calls "
    "new_group() and the name comes from a counter all ranks share), or create the "
    "member-named groups before any group that only some of their members belong to.",
    "created": SAME + "make the earlier groups named above on every rank, in the same "
    "order (without use_local_synchronization=True), or create the member-named groups "
    "before them. Creating this group without use_local_synchronization=True does not cure "
    "it alone: a group its members made alone also advanced on them only the counter that "
    "names every later new_group(), so a plain new_group() gets different names too.",
    "chained": SAME + "every member must hold as many groups of these members when it "
    "creates it: make, and destroy, the groups of these members on all of them alike, or "
    "create it without use_local_synchronization=True.",
    None: SAME + "make the groups before it alike on all its members (the same groups, "
    "made or joined, in the same order), or create them all without "
    "use_local_synchronization=True, on every rank in the same order."}
REMEDIES["both"] = REMEDIES["created"]


@dataclass
class Split:
    """A member list whose members gave its newest creation different names."""

    members: tuple[int, ...]
    sides: list[tuple[str, list[int]]]  # (name, the ranks that gave it), largest first
    made: dict[int, Made]  # each of those ranks' creation of it


class MemberNames:
    """Each rank's creations of each member list under names that are not counter names."""

    def __init__(self):
        self.by_list: dict[tuple[int, ...], dict[int, dict[int, Made]]] = {}
        self._split: dict[tuple[int, ...], Split] = {}  # the lists split now
        self._dirty: set[tuple[int, ...]] = set()  # lists with a creation seen since

    def see(self, made: Made, rank: int) -> None:
        if counted(made.name) or not made.members:
            return
        key = tuple(sorted(made.members))
        if key not in self.by_list and len(self.by_list) >= MAX_LISTS:
            return
        self.by_list.setdefault(key, {}).setdefault(rank, {})[made.index] = made
        self._dirty.add(key)

    def splits(self) -> list[Split]:
        """The member lists whose members named their newest creation apart (asked on every
        pass: a list is judged again only after a creation of it was seen)."""
        for key in self._dirty:
            split = _split(key, self.by_list[key])
            if split is None:
                self._split.pop(key, None)
            else:
                self._split[key] = split
        self._dirty.clear()
        return [self._split[key] for key in sorted(self._split)]

    def names(self) -> list[str]:
        return [name for s in self.splits() for name, _ in s.sides]


def _waiting(m: Made) -> bool:
    return m.t_end_ns is None or m.failed


def _split(members: tuple, by: dict[int, dict[int, Made]]) -> Split | None:
    newest = {r: made[max(made)] for r, made in by.items() if made}
    sides: dict[str, list[int]] = {}
    for r in sorted(newest):
        sides.setdefault(newest[r].name, []).append(r)
    if len(sides) < 2:
        return None
    used = {r: {m.name for m in made.values()} for r, made in by.items()}

    def apart(a: int, b: int) -> bool:
        x, y = newest[a], newest[b]
        if x.name in used[b] or y.name in used[a]:
            return False  # one of them is behind the other, or ahead: not a split
        if _waiting(x) and _waiting(y):
            return True  # neither can get out: each waits on keys the other never writes
        # both done (a backend that meets at the first collective): as many creations of
        # it on both, or a ring lost the old ones on one of them
        return not _waiting(x) and not _waiting(y) and len(by[a]) == len(by[b])

    names = list(sides)
    involved = {n for i, x in enumerate(names) for y in names[i + 1:]
                if any(apart(a, b) for a in sides[x][:MAX_SIDE] for b in sides[y][:MAX_SIDE])
                for n in (x, y)}
    if len(involved) < 2:
        return None
    kept = sorted(((n, sides[n]) for n in involved), key=lambda s: (-len(s[1]), s[1]))
    return Split(members, kept, {r: newest[r] for _, rs in kept for r in rs})


@lru_cache(maxsize=512)  # a pass asks again for the same names
def read_count(name: str, members: tuple[int, ...]) -> tuple[str, int] | None:
    """(recipe, count) whose hash gives `name` for `members` (in the order torch joined
    them): "salted", sha1 of the members and the count (torch 2.13, 2.15); "chained",
    sha1 of the members hashed again once per group of them held (torch 2.4). None: no
    recipe known here gives it."""
    if not SHA1.fullmatch(name):
        return None
    joined = "_".join(map(str, members))
    for n in range(MAX_COUNT):
        if hashlib.sha1(f"{joined}_{n}".encode()).hexdigest() == name:
            return "salted", n
    h = hashlib.sha1(joined.encode()).hexdigest()
    for n in range(MAX_COUNT):
        if h == name:
            return "chained", n
        h = hashlib.sha1(f"{h}_".encode()).hexdigest()
    return None


def _count(m: Made) -> tuple[str, int] | None:
    got = read_count(m.name, tuple(m.members))
    if got is None and list(m.members) != sorted(m.members):
        got = read_count(m.name, tuple(sorted(m.members)))
    return got


def _before(made: Creations, rank: int, m: Made) -> list[Made]:
    """The rank's creations before `m`, in order."""
    by = made.by_rank.get(rank, {})
    return [by[i] for i in sorted(by) if i < m.index]


def _counted_by(rule: str, rank: int, m: Made, earlier: list[Made]) -> list[Made]:
    """The earlier creations `rule` counts on `rank`."""
    if rule == "member":
        return [x for x in earlier if rank in x.members]
    if rule == "chained":
        key = sorted(m.members)
        return [x for x in earlier if not counted(x.name) and sorted(x.members) == key]
    return earlier


def _rule(made: Creations, split: Split) -> str | None:
    """How the counts in the names were counted, from what each rank created before: the
    way that gives every rank's count read back from its name (None: none does, e.g. a
    ring that lost old creations, or a recipe not known here)."""
    counts = {r: _count(m) for r, m in split.made.items()}
    recipes = {c[0] for c in counts.values() if c is not None}
    if len(recipes) != 1 or None in counts.values():
        return None
    rules = ("chained",) if recipes == {"chained"} else ("member", "created")
    base = 0 if recipes == {"chained"} else 1  # the default group, which no span records
    fits = [rule for rule in rules if all(
        base + len(_counted_by(rule, r, m, _before(made, r, m))) == counts[r][1]
        for r, m in split.made.items())]
    return "both" if len(fits) == 2 else (fits[0] if fits else None)


def _line(m: Made) -> tuple:
    cs = m.callsite or {}
    return cs.get("file"), cs.get("line")


def _per_line(ms: list[Made]) -> dict[tuple, list[Made]]:
    out: dict[tuple, list[Made]] = {}
    for m in ms:
        out.setdefault(_line(m), []).append(m)
    return out


def raised_lines(made: Creations, split: Split, rule: str | None) -> list[dict]:
    """Where the count differs between the first two names' ranks: the lines of the
    earlier creations counted more times on one than on the other (a line each rank
    counts as often, whatever its members, explains nothing: every rank is in one of
    new_subgroups' groups). With no known rule, the lines of every earlier creation."""
    a, b = split.sides[0][1][0], split.sides[1][1][0]
    counted_on, made_on = {}, {}
    for r in (a, b):
        earlier = _before(made, r, split.made[r])
        made_on[r] = _per_line(earlier)
        counted_on[r] = _per_line(_counted_by(rule or "created", r, split.made[r], earlier))
    out = []
    for line in set(counted_on[a]) | set(counted_on[b]):
        n = {r: len(counted_on[r].get(line, ())) for r in (a, b)}
        if n[a] == n[b]:
            continue
        hi, lo = (a, b) if n[a] > n[b] else (b, a)
        out.append({"made": counted_on[hi][line][-1], "more_on": hi, "fewer_on": lo,
                    "counts": n, "made_on_fewer": len(made_on[lo].get(line, ()))})
    return sorted(out, key=lambda e: e["made"].index)


def raised_text(e: dict, split: Split, world: set[int], made: Creations,
                  guard_of) -> tuple[str, dict]:
    """The words for one line of `raised_lines`, and its rank condition (with who took it)."""
    x, hi, lo = e["made"], e["more_on"], e["fewer_on"]
    hi_side = next(rs for _, rs in split.sides if hi in rs)
    text = f"{members_text(x.members)} at {site_text(x.callsite) or 'an unknown line'}"
    if e["made_on_fewer"] >= e["counts"][hi]:  # made there as often: counted as a member
        return text + f", which rank {lo} also made but is not a member of", {}
    makers = sorted(r for r in world if any(_line(y) == _line(x) for y in made.by_rank.get(
        r, {}).values()))
    skipped = sorted(world - set(makers))
    if e["counts"][lo] or not skipped:
        text += (f", made {e['counts'][hi]} time(s) on rank {hi} and {e['counts'][lo]} on "
                 f"rank {lo}")
    else:
        text += f", which {who(makers)} made and {who(skipped)} did not"
    guard = guard_of(x)
    if guard is None:
        return text, {}
    text += (f", in the {guard['arm']} of `if {guard['condition']}:` "
             f"({os.path.basename(guard['file'])}:{guard['line']})")
    return text, dict(guard, created_by=makers[:64], skipped_by=skipped[:64],
                      raised=hi_side[:64])


def _names_text(split: Split) -> str:
    parts = []
    for name, rs in split.sides[:SHOWN]:
        c = _count(split.made[rs[0]])
        counts = {(_count(split.made[r]) or (None, None))[1] for r in rs}
        n = counts.pop() if c is not None and len(counts) == 1 else None
        n = f" after {n} group{'' if n == 1 else 's'}" if n is not None else ""
        parts.append(f"{who(rs)} named it {name[:12]}{n}")
    return ", ".join(parts)


def member_names_finding(made: Creations, splits: list[Split], positions: dict[int, tuple],
                         hangs: list[Finding], world: set[int], stuck_inside: bool,
                         guard_of) -> Finding:
    """The finding for member-named groups whose members named them apart (`splits`, one
    cause: the first is said in full, the others in short). `positions`: each rank's
    position now (engine/hangs.py); `hangs`: the hangs that follow (folded in);
    `guard_of(m)`: the rank condition around a creation's line (group_order.guard_of)."""
    world = set(world) | {r for s in splits for r in s.made}
    first = splits[0]
    m0 = next(iter(first.made.values()))
    rule = _rule(made, first)
    stuck = stuck_inside or any(f.kind in ("hang", "deadlock") for f in hangs)
    summary = (f"group {members_text(first.members)} (new_group at "
               f"{site_text(m0.callsite) or 'an unknown line'}, named by its members) has "
               f"more than one name: {_names_text(first)}, so its members wait on different "
               "store keys")
    if rule is not None:
        summary += f" (torch names such a group from its members and {COUNTS[rule]})"
    said, details_earlier, branch = earlier_said(made, first, rule, world, guard_of)
    if said:
        summary += ("; the counts differ because of the groups made before it: "
                    if rule else "; the ranks made other groups before it: ") + "; ".join(said)
    for s in splits[1:SHOWN]:
        summary += f"; also {members_text(s.members)}: {_names_text(s)}"
    if stuck:
        summary = hung_text(summary, positions)
    culprits, tie = split_culprits(made, splits, guard_of)
    details = {"reason": REASON, "group_name": first.sides[0][0],
               "members": list(first.members[:64]), "counted": rule,
               "names": [{"name": n, "ranks": rs[:64], "count": (_count(first.made[rs[0]])
                                                                 or (None, None))[1]}
                         for n, rs in first.sides],
               "earlier": details_earlier,
               "where": {str(r): p[0] for r, p in sorted(positions.items())}}
    sites, stacks = split_evidence(made, splits, lambda s: _rule(made, s), hangs, details,
                                   branch, tie or not culprits)
    return Finding("hang" if stuck else "mismatch", "error", summary, culprits, first.sides[0][0],
                   None, sites, stacks, details, REMEDIES[rule])


def earlier_said(made: Creations, split: Split, rule: str | None, world: set[int],
                 guard_of) -> tuple[list[str], list[dict], dict | None]:
    """(words, details, the first rank condition) for the earlier creations that raised
    one side's count (`raised_lines`)."""
    said, details, branch = [], [], None
    for e in raised_lines(made, split, rule)[:SHOWN]:
        text, guard = raised_text(e, split, world, made, guard_of)
        said.append(text)
        x = e["made"]
        details.append({"members": list(x.members[:64]), "group": x.name,
                        "file": (x.callsite or {}).get("file"),
                        "line": (x.callsite or {}).get("line"),
                        "counts": {str(r): n for r, n in e["counts"].items()},
                        "branch": guard or None})
        branch = branch or guard or None
    return said, details, branch


def hung_text(summary: str, positions: dict[int, tuple]) -> str:
    """The summary of a split the ranks are stuck on, with where each is now."""
    summary = "the job hangs because " + summary
    if positions:
        summary += "; now " + ", ".join(f"rank {r} {p[0]}"
                                        for r, p in sorted(positions.items())[:8])
    return summary


def split_evidence(made: Creations, splits: list[Split], rule_of, hangs: list[Finding],
                   details: dict, branch: dict | None, tie: bool) -> tuple[list[dict], dict]:
    """Put the further groups, the rank condition, the tie and the hangs into `details`;
    return (call sites: each side's creation and the earlier ones that raised a count,
    stacks of the hangs). `rule_of(split)`: how its counts were counted."""
    if branch:
        details["branch"] = branch
    if len(splits) > 1:
        details["other_groups"] = [{"members": list(s.members[:64]), "names": [
            {"name": n, "ranks": rs[:64]} for n, rs in s.sides]} for s in splits[1:16]]
    if tie:
        details["tie"] = True
    if hangs:
        details["hangs"] = [f.summary for f in hangs][:8]
    sites = []
    for s in splits[:SHOWN]:
        sites += [dict(m.callsite, rank=r, source="new_group")
                  for r, m in sorted(s.made.items())[:16] if (m.callsite or {}).get("file")]
    for e in [e for s in splits[:SHOWN] for e in raised_lines(made, s, rule_of(s))[:SHOWN]]:
        x = e["made"]  # the earlier creations that raised a count, each group's
        if (x.callsite or {}).get("file"):
            sites.append(dict(x.callsite, rank=e["more_on"], source="new_group"))
    return unique_sites(sites), {r: st for f in hangs for r, st in f.stacks.items()}


def split_culprits(made: Creations, splits: list[Split], guard_of) -> tuple[list[int], bool]:
    """(ranks, tie): per group, the ranks of a name fewer of its members gave than most
    did; where the names split evenly, the ranks whose count an earlier creation under a
    rank condition raised (the guarded call is the fault, as for a guarded collective);
    else none, a tie (every rank followed torch's rules: the count is torch's)."""
    odd: set[int] = set()
    tie = False
    for s in splits:
        total = sum(len(rs) for _, rs in s.sides)
        if 2 * len(s.sides[0][1]) > total:
            odd |= {r for _, rs in s.sides[1:] for r in rs}
            continue
        raised = {r for e in raised_lines(made, s, _rule(made, s)) if guard_of(e["made"])
                  for name, rs in s.sides if e["more_on"] in rs for r in rs}
        if raised:
            odd |= raised
        else:
            tie = True
    return sorted(odd), tie and not odd

