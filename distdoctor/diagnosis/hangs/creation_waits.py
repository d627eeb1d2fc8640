"""Ranks held inside group creation by other ranks: whom each waits for, and why.

A rank inside new_group waits for others in one of two places. While torch builds the
group (gloo's rendezvous at creation), for the group's members that have not begun it.
And where TORCH_DIST_INIT_BARRIER=1, after that, in the store barrier new_group ends with:
for a plain group it is over every rank of the job, members or not, keyed by the group's
name (`store_based_barrier_key:<name>` on the default store), so there a rank that never
creates a group of that name holds all the others, a non-member too. The tracer's span
ends when the group is built; a rank still sampled on the line that made it a while later,
with no op since, stands in that barrier (Creations.after_built).

What follows from whom they wait for: ranks each waiting inside a creation for a rank
inside another one, around a cycle, never get out (members that make their groups in
different orders: a deadlock, `cycle_finding`); ranks that wait for a rank still
computing are a long wait, never an error (`long_wait_finding`), as in a collective.
"""

from __future__ import annotations

import os

from distdoctor.diagnosis.hangs.creations import Creations, Made, members_text, unique_sites
from distdoctor.diagnosis.hangs.hang import _cycles
from distdoctor.findings import Finding, site_text, who

REASON_CYCLE = "group_creation_cycle"
REASON_LONG = "group_creation_wait"
SHOWN = 8  # ranks said in a summary
BARRIER_WORDS = ("TORCH_DIST_INIT_BARRIER=1 ends new_group with a store barrier over every "
                 "rank of the job, members or not, keyed by the group's name")
CYCLE_REMEDY = (
    "Make the groups in one order on every rank: walk one list of all the groups on every "
    "rank and create each one where the rank is a member of it (with "
    "use_local_synchronization=True; or every rank calls new_group() for every group "
    "without it). A group's members must all reach its creation before any of them goes on "
    "to create another one they share a member with.")
LONG_REMEDY = (
    "Not an error: the ranks waited inside new_group while the others worked. To shorten "
    "it, create the process groups before the work (right after init_process_group), on "
    "every rank at the same point.")


def waited_for(made: Creations, m: Made, in_barrier: bool, world: set[int]) -> list[int]:
    """The ranks a rank inside `m` waits for: the members that never began it (its name
    and members); in the barrier (its group built), every rank of the job that never
    began it."""
    ranks = world if in_barrier else set(m.members) & world
    return sorted(ranks - made.makers.get((m.name, tuple(sorted(m.members))), set()))


def stuck_text(rank: int, m: Made, in_barrier: bool) -> str:
    where = "in the store barrier at the end of" if in_barrier else "inside"
    return (f"rank {rank} is {where} new_group({members_text(m.members)}) at "
            f"{site_text(m.callsite) or 'an unknown line'} (its group {m.name[:12]})")


def cycles(waits: dict[int, list[int]]) -> list[list[int]]:
    """The ranks around cycles of waits between creations (each waits for one of the
    next, inside a creation of its own), each cycle once."""
    return _cycles({r: (None, [x for x in xs if x in waits]) for r, xs in waits.items()})


def _loop_order(comp: list[int], waits: dict[int, list[int]]) -> list[int]:
    """The ranks of a cycle in the order each waits for the next, from the lowest."""
    order, r = [], min(comp)
    while r not in order:
        order.append(r)
        r = min(x for x in waits[r] if x in comp)
    return order


def cycle_finding(made: Creations, comp: list[int], stuck: dict[int, Made],
                  barrier: set[int], waits: dict[int, list[int]], positions: dict[int, tuple],
                  guard_of) -> Finding:
    """The deadlock of ranks (`comp`) each inside a creation (`stuck`: rank -> it; in its
    barrier for those of `barrier`) waiting for a rank inside another (`waits`)."""
    order = _loop_order(comp, waits)
    links = []
    for i, r in enumerate(order):
        nxt = order[(i + 1) % len(order)]
        links.append(f"{stuck_text(r, stuck[r], r in barrier)} and waits there for rank "
                     f"{nxt}")
    summary = ("deadlock at group creation: " + "; ".join(links[:SHOWN])
               + ": each waits for a member of its group that never began it and is creating "
               "another group, so none gets out (the ranks create the groups they share in "
               "different orders)")
    if barrier & set(comp):
        summary += f"; {BARRIER_WORDS}"
    details = {"reason": REASON_CYCLE, "cycle": order,
               "inside": {str(r): {"group": stuck[r].name, "members": list(
                   stuck[r].members[:64]), "created_at": site_text(stuck[r].callsite),
                   "in_barrier": r in barrier, "waits_for": waits[r][:64]} for r in order},
               "created_before": {str(r): _before_text(made, r, stuck[r]) for r in order},
               "where": {str(r): p[0] for r, p in sorted(positions.items())}}
    guard = next((g for r in order if (g := guard_of(stuck[r])) is not None), None)
    if guard is not None:
        details["branch"] = guard
        summary += (f"; the creations stand in the {guard['arm']} of `if "
                    f"{guard['condition']}:` ({os.path.basename(guard['file'])}:"
                    f"{guard['line']})")
    before = [f"rank {r} had created {t}" for r in order
              if (t := details["created_before"][str(r)]) != "none"]
    if before:
        summary += "; before it, " + ", ".join(before[:4])
    sites = [dict(stuck[r].callsite, rank=r, source="new_group") for r in order
             if (stuck[r].callsite or {}).get("file")]
    return Finding("deadlock", "error", summary, sorted(comp), stuck[order[0]].name, None,
                   unique_sites(sites), {}, details, CYCLE_REMEDY)


def _before_text(made: Creations, rank: int, m: Made) -> str:
    """The groups `rank` created before `m`, in order: "[0, 1] at job.py:30, then ..."."""
    by = made.by_rank.get(rank, {})
    seq = [by[i] for i in sorted(by) if i < m.index]
    if not seq:
        return "none"
    shown = ", then ".join(f"{members_text(x.members)} at {site_text(x.callsite) or '?'}"
                           for x in seq[-4:])
    return (f"{len(seq) - 4} more, then " if len(seq) > 4 else "") + shown


def long_wait_finding(m: Made, waiting: dict[int, bool], late: list[int], waited_s: float,
                      at: dict[int, dict]) -> Finding:
    """Ranks (`waiting`: rank -> in the barrier) inside `m`'s creation for `waited_s`,
    held by ranks that have not begun it and compute (`late`, sampled at `at`)."""
    inside = who(waiting)
    summary = (f"long wait: {who(late)} {'has' if len(late) == 1 else 'have'} kept {inside} "
               f"waiting {waited_s:.0f} s in new_group({members_text(m.members)}) at "
               f"{site_text(m.callsite) or 'an unknown line'} (its group {m.name[:12]}) "
               f"before calling it")
    barrier = [r for r, b in waiting.items() if b]
    if barrier:
        summary += f"; {BARRIER_WORDS}"
    sites = []
    for r in late[:SHOWN]:
        pos = at.get(r)
        if pos and pos.get("file"):
            summary += f"; rank {r} is computing at {site_text(pos)}"
            sites.append({"rank": r, **pos, "source": "sample"})
    first = min(waiting)
    if (m.callsite or {}).get("file"):
        sites.append(dict(m.callsite, rank=first, source="new_group"))
    details = {"reason": REASON_LONG, "group_name": m.name, "members": list(m.members[:64]),
               "waiting_ranks": sorted(waiting)[:64], "in_barrier": barrier[:64],
               "waited_s": round(waited_s, 1), "in_flight": True,
               "computing_at": {str(r): site_text(p) for r, p in at.items() if p}}
    return Finding("long_wait", "info", summary, sorted(late), m.name, None, sites, {},
                   details, LONG_REMEDY)


def done(f: Finding) -> None:
    """A long wait of `long_wait_finding` that ended: its ranks got out of new_group."""
    f.details["in_flight"] = False
    f.summary = (f.summary.replace(" has kept ", " kept ", 1).replace(" have kept ", " kept ", 1)
                 .replace(" is computing at ", " was computing at ") + " (it completed)")
