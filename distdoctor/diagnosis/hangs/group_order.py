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

from distdoctor.diagnosis.parting import source as S
from distdoctor.diagnosis.parting.conditions import kind_of
from distdoctor.findings import Finding, who

MAX_NAMES = 4096  # group names followed (a job has a few; past this, no name is split)
MAX_LISTS = 8  # member lists kept per name (the last one stands for any further ones)
# the calls that create process groups, by their last name
CREATORS = {"new_group", "new_subgroups", "new_subgroups_by_enumeration", "split_group",
            "init_device_mesh", "DeviceMesh"}
SHOWN_LINES = 8
REMEDY = ("Create every process group on every rank, in the same order: torch's rule for "
          "new_group() is that every rank calls it for every group, also the groups it is not "
          "a member of (or pass use_local_synchronization=True, which names a group by its "
          "members, so that only the members call it).")


class GroupNames:
    """Which member list each rank's group name stands for."""

    def __init__(self):
        # off where an event's members are those expected at that op, not the group's
        # (the Flight Recorder's dumps: a rank whose ring wrapped witnesses fewer ops)
        self.off = False
        self.lists: dict[str, list[tuple[int, ...]]] = {}  # name -> member lists, in order seen
        self.users: dict[tuple[str, int], set[int]] = {}  # (name, list) -> ranks using it
        self.sites: dict[tuple[str, int], dict] = {}  # (name, list) -> a call site on it

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
        """The names that stand for more than one member list."""
        return [n for n, lists in self.lists.items() if len(lists) > 1]

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


def _members_text(members: tuple[int, ...]) -> str:
    shown = ", ".join(map(str, members[:8]))
    return f"[{shown}{', ...' if len(members) > 8 else ''}]"


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


def group_order_finding(names: GroupNames, name: str, positions: dict[int, tuple],
                        hangs: list[Finding], files) -> Finding:
    """The finding for a name that stands for several groups. `positions`: each rank's
    position now, (words, sampled file, sampled line) (engine/hangs.py); `hangs`: the
    hang findings that follow from it (folded in: the job hangs, and this is why);
    `files`: the user's files the ops and samples name."""
    meanings = names.meanings(name)
    said = "; ".join(f"{_members_text(m)} on {who(rs)}" for m, rs in meanings if rs)
    created, split = creation_lines(files)
    where = _where(positions, created)
    culprits = names.odd_ranks()
    stuck = any(f.kind in ("hang", "deadlock") for f in hangs)
    summary = ("the ranks created their process groups in different orders: "
               f"group {name} is {said} (torch names a group by how many groups the rank "
               "created before it, so every rank must create every group in the same order)")
    if split:
        summary += f"; the groups are created in the arms of {split}"
    elif created:
        summary += f"; the groups are created at {_lines_text(created)}"
    if stuck:
        summary = "the job hangs because " + summary
        if where:
            summary += "; now " + ", ".join(f"rank {r} {w}" for r, w in sorted(where.items()))
    details = {"reason": "group_creation_order", "group_name": name,
               "meanings": [{"members": list(m), "ranks": rs} for m, rs in meanings],
               "created_at": created, "where": {str(r): w for r, w in sorted(where.items())}}
    if split:
        details["rank_condition"] = split
    if not culprits:
        details["tie"] = True  # the ranks split evenly: neither order is the odd one
    if hangs:
        details["hangs"] = [f.summary for f in hangs][:8]
    # the lines: a rank seen inside a call that creates a group, then each list's first op
    sites = [{"rank": r, "file": file, "line": line, "source": "sample"}
             for r, (_, file, line) in sorted(positions.items())
             if any((c["file"], c["line"]) == (file, line) for c in created)]
    sites += [dict(cs) for (n, _), cs in sorted(names.sites.items()) if n == name]
    stacks = {r: s for f in hangs for r, s in f.stacks.items()}
    return Finding("hang" if stuck else "mismatch", "error", summary, culprits, name, None,
                   sites, stacks, details, REMEDY)
