"""One group name, two groups: process groups created in a rank-dependent order.

torch names a process group by a counter of the groups the rank has created so far
(`new_group()` without `use_local_synchronization`; the hashed names of `split_group` and
of local synchronization hold the members), which is why every rank must call
`new_group()` for every group, in the same order. Where ranks create them in different
orders, one name stands for different ranks on different ranks: the groups meet on the same
store prefix and the backend wires them at random (across the two groups, or a rank never
gets through `new_group`). The tracer records each op's group name and members, so a name
whose members differ between ranks is this bug, whatever the wiring did.

Two things follow. The engine keeps such ops apart: a rendezvous is one name *and* one
member list (`GroupNames.variant`), so ranks of the other list never make up for a member
still in flight. And one finding says the cause at the lines that create the groups, with
where each rank is now (`group_order_finding`); the hangs that follow are folded into it.
"""

from __future__ import annotations

import ast
import os
from functools import lru_cache

from distdoctor.diagnosis.hangs.counter_names import REASON as COUNTER_NAMES
from distdoctor.diagnosis.hangs.counter_names import CounterNames, counter_names_finding
from distdoctor.diagnosis.hangs.creation_waits import BARRIER_WORDS, stuck_text
from distdoctor.diagnosis.hangs.creations import (
    Creations,
    Made,
    counter_order,
    members_text,
    unique_sites,
)
from distdoctor.diagnosis.hangs.member_names import REASON as MEMBER_NAMES
from distdoctor.diagnosis.hangs.member_names import MemberNames, member_names_finding
from distdoctor.diagnosis.hangs.member_skipped import REASON as MEMBER_SKIPPED
from distdoctor.diagnosis.parting import source as S
from distdoctor.diagnosis.parting.conditions import kind_of
from distdoctor.findings import Finding, site_text, who

MAX_NAMES = 4096  # group names followed (a job has a few; past this, no name is split)
MAX_LISTS = 8  # member lists kept per name (the last one stands for any further ones)
# the calls that create process groups, by their last name
CREATORS = {"new_group", "new_subgroups", "new_subgroups_by_enumeration", "split_group",
            "init_device_mesh", "DeviceMesh"}
SHOWN_LINES = 8
GROUP_CAUSES = ("group_creation_order", "group_creation_skipped", MEMBER_NAMES,  # .reason
                MEMBER_SKIPPED, COUNTER_NAMES)
REMEDY = ("Create every process group on every rank, in the same order: torch's rule for "
          "new_group() is that every rank calls it for every group, also the groups it is not "
          "a member of. use_local_synchronization=True is no way out of a rank-dependent "
          "order: torch names such a group from its members and a count each member keeps "
          "(the groups it made or belongs to before it), which such an order makes differ "
          "between members, so they name one group apart and hang inside new_group().")
SKIPPED_REMEDY = (
    "Call new_group() on every rank for every group, in the same order, also on the ranks "
    "that are not members of it (torch's rule: the name comes from a counter all ranks "
    "advance together). use_local_synchronization=True, which lets only the members call "
    "it, is safe only where every member made the same groups before it (torch names such "
    "a group from its members and a count each member keeps), and where torch counts the "
    "groups a rank created (2.15) it advances the counter that names every later "
    "new_group() on the members alone: a later group made by all ranks then gets different "
    "names on members and non-members, and hangs.")


class GroupNames:
    """Which member list each rank's group name stands for."""

    def __init__(self):
        # off where an event's members are those expected at that op, not the group's
        # (the Flight Recorder's dumps: a rank whose ring wrapped witnesses fewer ops)
        self.off = False
        self.lists: dict[str, list[tuple[int, ...]]] = {}  # name -> member lists, in order seen
        self.users: dict[tuple[str, int], set[int]] = {}  # (name, list) -> ranks using it
        self.sites: dict[tuple[str, int], dict] = {}  # (name, list) -> a call site on it
        self.creations = Creations()  # what each rank created, in order (creations.py)
        self.member_names = MemberNames()  # groups named by their members (member_names.py)
        self.counter_names = CounterNames(self.creations)  # counter_names.py
        self.skip_known = False  # a hang is said as a creation some member skipped

    def created(self, ev) -> None:
        """A group creation the tracer recorded: its name stands for its members on this
        rank from the call on, before any op of the group (a rank may never get past it)."""
        made = self.creations.see(ev)
        if made is not None:
            self.member_names.see(made, ev.rank)
        if made is not None and made.members:
            self.variant(made.name, made.members, ev.rank, made.callsite)

    def began(self, rank: int, index: int) -> None:
        """The number of the first event of `rank` the engine read: whether its log still
        held its first creations (Creations.whole)."""
        self.creations.began(rank, index)

    def variant(self, name: str, members: tuple, rank: int, callsite: dict | None) -> int:
        """The number of the member list `name` stands for on `rank` (0: the first seen).
        Called once per rank and name (the engine keeps the answer), never per op."""
        if self.off or not members or (name not in self.lists
                                        and len(self.lists) >= MAX_NAMES):
            return 0
        key = tuple(sorted(members))
        lists = self.lists.setdefault(name, [])
        if key in lists:
            i = lists.index(key)
        else:
            if len(lists) < MAX_LISTS:
                lists.append(key)
            i = len(lists) - 1
        self.users.setdefault((name, i), set()).add(rank)
        if callsite and callsite.get("file"):
            self.sites.setdefault((name, i), dict(callsite, rank=rank))
        return i

    def conflicts(self) -> list[str]:
        """The names that stand for more than one member list; else those of a group named
        by its members that its members named apart (member_names.py); else those of a
        group all ranks make that a counter of every creation named apart (counter_names.py)."""
        return ([n for n, lists in self.lists.items() if len(lists) > 1]
                or self.member_names.names() or self.counter_names.names())

    def meanings(self, name: str) -> list[tuple[tuple[int, ...], list[int]]]:
        """Each member list of `name`, with the ranks that used the name for it."""
        return sorted((members, sorted(self.users.get((name, i), ())))
                      for i, members in enumerate(self.lists.get(name, ())))

    def odd_ranks(self) -> list[int]:
        """Ranks that call a member list by another name than most of its members do
        (they created their groups in another order than the majority); none where the
        ranks split evenly (then nothing says which order is the wrong one)."""
        by_list: dict[tuple, dict[str, set[int]]] = {}
        for (name, i), ranks in self.users.items():
            members = self.lists[name][i]
            by_list.setdefault(members, {}).setdefault(name, set()).update(ranks)
        odd: set[int] = set()
        for used in by_list.values():
            if len(used) < 2:
                continue
            total = sum(map(len, used.values()))
            top = max(used, key=lambda n: len(used[n]))
            if 2 * len(used[top]) > total:
                odd.update(r for n, ranks in used.items() if n != top for r in ranks)
        return sorted(odd)


def creation_lines(paths) -> tuple[list[dict], str | None]:
    """The calls that create process groups in the user's files, and the rank condition
    whose arms hold them where one does ("`if rank < 2:` (job.py:24)")."""
    lines, split = _creation_lines(tuple(sorted({p for p in paths if p})))
    return [dict(entry) for entry in lines], split


@lru_cache(maxsize=16)  # asked on every pass while the job runs
def _creation_lines(paths: tuple[str, ...]) -> tuple[list[dict], str | None]:
    lines, split = [], None
    for path in paths:
        src = S.read(path)
        if src is None:
            continue
        calls = [n for n in ast.walk(src.tree) if isinstance(n, ast.Call)
                 and _call_name(n.func) in CREATORS]
        for call in sorted(calls, key=lambda n: n.lineno):
            lines.append({"file": path, "line": call.lineno, "code": src.segment(call, 80)})
        if split is None:
            split = _rank_split(src, [c.lineno for c in calls])
    return lines[:4 * SHOWN_LINES], split


def _call_name(func: ast.AST) -> str:
    if isinstance(func, ast.Attribute):
        return func.attr
    return getattr(func, "id", "")


def _rank_split(src: S.Source, lines: list[int]) -> str | None:
    """The `if` on the rank's identity with group creations in more than one arm, as
    "`if rank < 2:` (job.py:24): job.py:25, 26 in its body, job.py:28, 29 in its else"."""
    name = os.path.basename(src.path)
    for node in ast.walk(src.tree):
        if not isinstance(node, ast.If) or kind_of(src, node.test) != "rank":
            continue
        held = [(arm, [ln for ln in lines if S.spans(block, ln)]) for arm, block in S.arms(node)]
        held = [(arm, lns) for arm, lns in held if lns]
        if len(held) > 1:
            arms = ", ".join(f"{name}:{', '.join(map(str, lns))} in its {arm}"
                             for arm, lns in held)
            return f"`if {src.segment(node.test, 60)}:` ({name}:{node.lineno}): {arms}"
    return None


def _lines_text(lines: list[dict]) -> str:
    """"job.py:25, 26, 28, 29" (per file)."""
    by_file: dict[str, list[int]] = {}
    for entry in lines[:SHOWN_LINES]:
        by_file.setdefault(os.path.basename(entry["file"]), []).append(entry["line"])
    return "; ".join(f"{f}:{', '.join(map(str, sorted(set(ls))))}" for f, ls in by_file.items())


def _where(positions: dict[int, tuple], created: list[dict]) -> dict[int, str]:
    """Each rank's position in words; a rank sampled on a line that creates a group is
    inside that call ("in new_group at job.py:25")."""
    calls = {(c["file"], c["line"]): c["code"] for c in created}
    out = {}
    for rank, (text, file, line) in positions.items():
        code = calls.get((file, line))
        out[rank] = (f"in {code.split('(', 1)[0].rsplit('.', 1)[-1]} {text}"
                     if code and text.startswith("at ") else text)
    return out


def guard_of(m: Made) -> dict | None:
    """The innermost `if` on the rank's identity with the line that made `m` in an arm:
    {file, line, condition, arm}; None where there is none (or no source)."""
    cs = m.callsite or {}
    src = S.read(cs.get("file")) if cs.get("file") else None
    line = cs.get("line")
    if src is None or not isinstance(line, int):
        return None
    found = None
    for node in ast.walk(src.tree):
        if isinstance(node, ast.If) and kind_of(src, node.test) == "rank":
            arm = next((a for a, block in S.arms(node) if S.spans(block, line)), None)
            if arm is not None and (found is None or node.lineno > found["line"]):
                found = {"file": src.path, "line": node.lineno, "arm": arm,
                         "condition": src.segment(node.test, 60)}
    return found


def guarded(m: Made) -> bool:
    return guard_of(m) is not None


def _said_guard(names: GroupNames, world: set[int], summary: str, details: dict) -> str:
    """The first group that some ranks created and others did not, where its creation
    stands under a condition on the rank's identity: that condition, and who took it."""
    for (members, _), by in names.creations.partial(world):
        made_by = set(by)
        first = by[min(by)][1]
        guard = guard_of(first)
        if guard is None:
            continue
        skipped = sorted(names.creations.whole(world) - made_by)
        details["branch"] = dict(guard, created_by=sorted(made_by)[:64],
                                 skipped_by=skipped[:64])
        return (summary + f"; new_group({members_text(members)}) at "
                f"{site_text(first.callsite)} stands in the {guard['arm']} of `if "
                f"{guard['condition']}:` ({os.path.basename(guard['file'])}:{guard['line']}),"
                f" which {who(made_by)} took and {who(skipped)} did not")
    return summary


def _culprits(names: GroupNames, world: set[int]) -> tuple[list[int], bool]:
    """(ranks, tie): the ranks whose creations part from the majority's; in a log with
    no creations (before the tracer recorded them), those whose group names do."""
    if names.creations.by_rank:  # what each rank created, in order: the whole story
        return names.creations.culprits(world, guarded)
    return names.odd_ranks(), False


def _said_orders(names: GroupNames, world: set[int], summary: str, details: dict) -> str:
    """What each rank created, in order and where, into the summary and the details."""
    made = names.creations
    if not any(made.order(r) for r in world):
        return summary
    details["creations"] = made.details(world)
    return summary + f"; {made.orders_text(world)}"


def group_order_finding(names: GroupNames, conflicts: list[str], positions: dict[int, tuple],
                        hangs: list[Finding], files, world: set[int] = frozenset(),
                        stuck_inside: bool = False) -> Finding:
    """The finding for the names that stand for several groups (`conflicts`, one cause:
    the first name is said, the others in the details). `positions`: each rank's
    position now, (words, sampled file, sampled line) (engine/hangs.py); `hangs`: the
    hang findings that follow from it (folded in: the job hangs, and this is why);
    `files`: the user's files the ops and samples name; `world`: the ranks of the job;
    `stuck_inside`: a rank has been inside a group creation too long to be slow."""
    splits = names.member_names.splits()
    if splits and not any(len(names.lists.get(n, ())) > 1 for n in conflicts):
        return member_names_finding(names.creations, splits, positions, hangs, world,
                                    stuck_inside, guard_of)
    counter = names.counter_names.splits()
    if counter and not any(len(names.lists.get(n, ())) > 1 for n in conflicts):
        return counter_names_finding(names.creations, counter, positions, hangs, world,
                                     stuck_inside, guard_of)
    conflicts = sorted(conflicts, key=lambda n: (not n.isdigit(), counter_order(n)
                                                 if n.isdigit() else (0, ""), n))
    name = conflicts[0]
    meanings = names.meanings(name)
    said = "; ".join(f"{members_text(m)} on {who(rs)}" for m, rs in meanings if rs)
    created, split = creation_lines(files)
    where = _where(positions, created)
    world = set(world) | {r for _, rs in meanings for r in rs}
    culprits, tie = _culprits(names, world)
    stuck = stuck_inside or any(f.kind in ("hang", "deadlock") for f in hangs)
    summary = ("the ranks created their process groups in different orders: "
               f"group {name} is {said} (torch names a group by how many groups the rank "
               "created before it, so every rank must create every group in the same order)")
    details = {"reason": GROUP_CAUSES[0], "group_name": name,
               "meanings": [{"members": list(m), "ranks": rs} for m, rs in meanings],
               "created_at": created, "where": {str(r): w for r, w in sorted(where.items())}}
    if len(conflicts) > 1:
        details["other_names"] = {n: [{"members": list(m), "ranks": rs}
                                      for m, rs in names.meanings(n)] for n in conflicts[1:8]}
    summary = _said_orders(names, world, summary, details)
    if split:
        summary += f"; the groups are created in the arms of {split}"
    else:
        summary = _said_guard(names, world, summary, details)
        if created and "creations" not in details:  # a log without creations
            summary += f"; the groups are created at {_lines_text(created)}"
    if stuck:
        summary = "the job hangs because " + summary
        if where:
            summary += "; now " + ", ".join(f"rank {r} {w}" for r, w in sorted(where.items()))
    if split:
        details["rank_condition"] = split
    if tie or not culprits:
        details["tie"] = True  # the ranks split evenly: neither order is the odd one
    if hangs:
        details["hangs"] = [f.summary for f in hangs][:8]
    sites = _sites(names, positions, created, culprits)
    sites += [dict(cs) for (n, _), cs in sorted(names.sites.items()) if n == name]
    sites = unique_sites(sites)
    stacks = {r: s for f in hangs for r, s in f.stacks.items()}
    return Finding("hang" if stuck else "mismatch", "error", summary, culprits, name, None,
                   sites, stacks, details, REMEDY)


def _sites(names: GroupNames, positions: dict[int, tuple], created: list[dict],
           culprits: list[int]) -> list[dict]:
    """The lines: the culprits' creations first, then the creations of groups that only
    some ranks made, then a rank seen inside a call that creates a group (its creation in
    the log, or its sampled line on one)."""
    out = []
    made = names.creations
    world = set(made.by_rank)
    for r in culprits[:8]:
        for m in made.order(r)[:4]:
            if m.callsite and m.callsite.get("file"):
                out.append(dict(m.callsite, rank=r, source="new_group"))
    # where the ranks differ: each creation of a group that only some ranks made
    for _, by in made.partial(world)[:4]:
        for r, (_, m) in sorted(by.items())[:8]:
            if m.callsite and m.callsite.get("file"):
                out.append(dict(m.callsite, rank=r, source="new_group"))
    for r, (_, file, line) in sorted(positions.items()):
        inside = names.creations.inside(r)
        if inside is not None and inside.callsite and inside.callsite.get("file"):
            out.append(dict(inside.callsite, rank=r, source="new_group"))
        elif any((c["file"], c["line"]) == (file, line) for c in created):
            out.append({"rank": r, "file": file, "line": line, "source": "sample"})
    return out


def skipped_finding(names: GroupNames, stuck: dict[int, Made], positions: dict[int, tuple],
                    hangs: list[Finding], world: set[int],
                    barrier: set[int] = frozenset()) -> Finding:
    """The hang whose ranks wait inside a group creation that other ranks never began
    (`stuck`: rank -> the creation it is inside; those of `barrier` in the store barrier
    at its end, creation_waits.py): one group name, one member list on every rank that
    made it, so no name disagrees; the others went on past it, or stopped short of it,
    and wait elsewhere."""
    m = next(iter(stuck.values()))
    missing = names.creations.missing(m, world)
    culprits, tie = names.creations.culprits(world, guarded)
    members = [r for r in missing if r in m.members]
    inside = ", ".join(stuck_text(r, x, r in barrier) for r, x in sorted(stuck.items())[:8])
    elsewhere = ", ".join(f"rank {r} {positions[r][0]}" for r in missing[:8] if r in positions)
    summary = (f"the job hangs because {inside}, which {who(missing)} never called"
               + (f" ({who(members)} {'is a member' if len(members) == 1 else 'are members'}"
                  " of it)" if members else "")
               + ": torch requires every rank to call new_group() for every group, in the "
               "same order")
    if barrier:  # there a non-member holds the others too: it never wrote the name's key
        summary += (f"; {BARRIER_WORDS}: it ends only when every rank has created a "
                    "group of that name")
    details = {"reason": GROUP_CAUSES[1], "group_name": m.name,
               "members": list(m.members[:64]), "created_at": site_text(m.callsite),
               "inside": {str(r): site_text(x.callsite) for r, x in sorted(stuck.items())},
               "never_created": missing[:64],
               "where": {str(r): p[0] for r, p in sorted(positions.items())}}
    if barrier:
        details["in_barrier"] = sorted(barrier)[:64]
    summary = _said_orders(names, world, summary, details)
    summary = _said_guard(names, world, summary, details)
    if elsewhere:
        summary += f"; now {elsewhere}"
    if tie or not culprits:
        details["tie"] = True
    if hangs:
        details["hangs"] = [f.summary for f in hangs][:8]
    sites = unique_sites(_sites(names, positions, [], culprits))
    stacks = {r: s for f in hangs for r, s in f.stacks.items()}
    return Finding("hang", "error", summary, culprits, m.name, None, sites, stacks, details,
                   SKIPPED_REMEDY)
