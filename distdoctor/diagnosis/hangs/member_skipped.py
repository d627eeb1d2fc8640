"""A group named by its members that one of its members never calls.

`new_group(..., use_local_synchronization=True)` is called by the group's members alone, so
no counter name tells that a rank skipped it (creations.py compares counter names only): a
member that never calls it leaves the others inside new_group, waiting on store keys it
never writes (gloo at creation; NCCL at the group's first collective). What tells: a rank a
hang waits for is inside a creation named by its members, and a member of that group never
began a creation of those members under that name and cannot come to it any more: it waits
in a collective the rank inside new_group never joined (each waits for the other), or it
has ended. A member that is still computing, or waits on others, may yet call it: quiet.
"""

from __future__ import annotations

import os

from distdoctor.diagnosis.hangs.creations import Made, members_text, unique_sites
from distdoctor.diagnosis.hangs.member_names import read_count
from distdoctor.findings import Finding, site_text, who

REASON = "group_member_skipped"
SHOWN = 8  # ranks said in a summary
# what the count in the name counts, by the recipe read back from it (member_names.py)
COUNTED = {"salted": "a count of the groups the rank made or belongs to before it",
           "chained": "the number of groups of these same members the rank holds"}


def remedy(recipe: str | None, members, guard: dict | None) -> str:
    """What to try: every member calls it (non-members need not), on the same count."""
    where = (f" (its rank condition `if {guard['condition']}:` must take in all of "
             f"{members_text(members)})" if guard else "")
    count = COUNTED.get(recipe, "a count each rank keeps")
    return ("Call new_group(..., use_local_synchronization=True) on every member of the group"
            f"{where}; ranks that are not members need not call it. Each member must reach "
            f"it after the same groups: torch names the group from its members and {count}, "
            "so a member that calls it after other groups than the others names it apart and "
            "still hangs. Or create it without use_local_synchronization=True, on every rank "
            "in the same order.")


def skippers(made, m: Made, rank: int, world: set[int]) -> list[int]:
    """The members of `m`'s group (in `world`, but `rank`, which is inside it) that never
    began a creation of those members under its name."""
    key = sorted(m.members)
    return sorted(r for r in set(m.members) & world if r != rank and not any(
        x.name == m.name and sorted(x.members) == key
        for x in made.by_rank.get(r, {}).values()))


def skipped_by_members_finding(made, stuck: dict[int, Made], gone: dict[int, dict],
                               positions: dict[int, tuple], hangs: list[Finding],
                               guard_of) -> Finding:
    """The hang whose ranks wait inside a member-named creation (`stuck`: rank -> it) that
    members never called (`gone`: rank -> {"text", "callsite"}, where it went on instead).
    `positions`: each rank's position now (engine/hangs.py); `hangs`: the hangs that follow
    (folded in); `guard_of(m)`: the rank condition around a creation's line."""
    rank, m = min(stuck.items())
    members = sorted(m.members)
    makers = sorted(r for r in members if any(
        x.name == m.name for x in made.by_rank.get(r, {}).values()))
    missing = sorted(gone)
    guard = guard_of(m)
    inside = ", ".join(f"{who([r])} is inside new_group({members_text(x.members)}) at "
                       f"{site_text(x.callsite) or 'an unknown line'}"
                       for r, x in sorted(stuck.items())[:SHOWN])
    went = "; ".join(f"rank {r} {g['text']}" for r, g in sorted(gone.items())[:SHOWN])
    summary = (f"the job hangs because {inside}, a group named by its members, which "
               f"{who(missing)}, {'a member' if len(missing) == 1 else 'members'} of it, "
               f"never called: only its members call such a group, and all of them must; "
               f"{went}")
    details = {"reason": REASON, "group_name": m.name, "members": members[:64],
               "created_at": site_text(m.callsite),
               "inside": {str(r): site_text(x.callsite) for r, x in sorted(stuck.items())},
               "never_created": missing[:64], "created_by": makers[:64],
               "went_on": {str(r): g["text"] for r, g in sorted(gone.items())[:64]},
               "where": {str(r): p[0] for r, p in sorted(positions.items())}}
    recipe = read_count(m.name, tuple(m.members))
    details["recipe"] = recipe[0] if recipe else None
    if guard is not None:
        took = makers
        summary += (f"; new_group at {site_text(m.callsite)} stands in the {guard['arm']} of "
                    f"`if {guard['condition']}:` ({os.path.basename(guard['file'])}:"
                    f"{guard['line']}), which {who(took)} took and {who(missing)} did not")
        details["branch"] = dict(guard, created_by=took[:64], skipped_by=missing[:64])
    others = [f"rank {r} {p[0]}" for r, p in sorted(positions.items())
              if r not in gone and r not in stuck][:SHOWN]
    if others:
        summary += "; now " + ", ".join(others)
    culprits, tie = _culprits(members, makers, missing, guard is not None)
    if tie:
        details["tie"] = True
    if hangs:
        details["hangs"] = [f.summary for f in hangs][:8]
    sites = [dict(x.callsite, rank=r, source="new_group") for r, x in sorted(stuck.items())
             if (x.callsite or {}).get("file")]
    sites += [dict(g["callsite"], rank=r) for r, g in sorted(gone.items())
              if (g.get("callsite") or {}).get("file")]
    stacks = {r: s for f in hangs for r, s in f.stacks.items()}
    return Finding("hang", "error", summary, culprits, m.name, None, unique_sites(sites),
                   stacks, details, remedy(details["recipe"], members, guard))


def _culprits(members: list[int], called: list[int], missing: list[int],
              guarded: bool) -> tuple[list[int], bool]:
    """(ranks, tie) among the group's members: the fewer side (most members called it: the
    ones that did not; most did not: the ones that did); an even split is broken by the
    program where the creation stands under a rank condition (the guarded call is the
    fault, as for a guarded collective); else a tie."""
    if 2 * len(called) > len(members):
        return missing, False
    if 2 * len(called) < len(members) or guarded:
        return called, False
    return [], True
