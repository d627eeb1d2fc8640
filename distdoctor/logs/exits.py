"""The launcher's reports of exits, judged beside the causes (for reasoning.py): an exit no
cause explains is a finding of its own (ranks that died the same way: one finding); a cause
printed with no rank belongs to the one rank the launcher reports as failed first."""

from __future__ import annotations

import re

from distdoctor.findings import Finding
from distdoctor.logs.families.launcher import describe_exit
from distdoctor.logs.problems import ranks_text
from distdoctor.logs.signals import TEARDOWN, TIMEOUT, VICTIM

SPAWN_TRACEBACK_LINES = 400  # from spawn's head to the last line of the traceback it heads


def exit_findings(ctx, out: list, cause_ranks: set[int]) -> None:
    """Exits no cause explains; ranks that died the same way are one finding."""
    same: dict[tuple, Finding] = {}
    # a crash printed with no rank (a traceback without a rank prefix) is the failure of a
    # process the launcher does not name either: one failure, not two
    unranked_crash = any(f.kind == "crash" and not f.ranks for _, f in out)
    for e in sorted(ctx.exits.values(), key=lambda e: e["order"]):
        if e["rank"] in cause_ranks or not _exit_is_a_cause(ctx, e):
            continue
        if e["rank"] < 0 and (cause_ranks or unranked_crash or any(
                x["rank"] >= 0 and not x.get("torn_down") for x in ctx.exits.values())):
            continue  # a rank the launcher does not name: the cause (or exit) found explains it
        cause_ranks.add(e["rank"])
        key = (e.get("signum"), e.get("exit_code"))
        if key in same and e["rank"] >= 0:
            g = same[key]
            g.ranks = sorted(set(g.ranks) | {e["rank"]})
            g.summary = re.sub(r"^ranks? [\d, -]+?(?= \D)", f"ranks {ranks_text(g.ranks)}",
                               g.summary).replace(" was killed", " were killed")
            continue
        summary, family, remedy = describe_exit(e)
        rank = e["rank"]
        same[key] = Finding(
            "crash", "error", summary, ranks=[rank] if rank >= 0 else [], remedy=remedy,
            details={"signature": f"log/{family}/exit/{rank}", "source": "log",
                     "family": family, "rule": "rank_exit",
                     "exit": {k: v for k, v in e.items() if isinstance(v, (int, str, bool))},
                     "lines": [e["line"].text[:300]] if e.get("line") else []})
        out.append((e["order"], same[key]))

def raised_reports_to_their_rank(ctx) -> None:
    """torch.multiprocessing.spawn's "-- Process N terminated with the following error:"
    heads the traceback of process N: a timeout or lost peer that traceback shows with no
    rank of its own is process N's (then its exit is that timeout's, not a failure of its
    own; the rank it waited for is judged as for any timeout)."""
    for rank, e in ctx.exits.items():
        line = e.get("line")
        if (rank < 0 or line is None or "exit_code" in e or e.get("signum")
                or "terminated with the following error" not in line.text):
            continue
        for p in ctx.problems.values():
            if (p.role in (TIMEOUT, VICTIM) and not p.ranks and p.first.line.file == line.file
                    and 0 < p.first.line.lineno - line.lineno <= SPAWN_TRACEBACK_LINES):
                p.ranks.add(rank)
                for s in p.signals:  # the child's traceback, quoted by its parent
                    s.fields["in_launcher"] = False


def _exit_is_a_cause(ctx, e: dict) -> bool:
    if e.get("torn_down"):
        return False
    for p in ctx.problems.values():
        # a rank that timed out (or lost a peer) exits because of it
        # (the launcher's own "closing signal" lines name a pid, never a rank: a rank they
        # seem to carry comes from a file's name)
        if (p.role in (TIMEOUT, VICTIM, TEARDOWN) and e["rank"] in p.ranks
                and p.rule != "teardown" and not p.field("in_launcher")):
            return False
        if p.role == TIMEOUT and e.get("signum") == 6:
            return False  # NCCL's watchdog aborts the process after a timeout
        if p.role == TIMEOUT and not e.get("signum") and ctx.ev.of_rank(e["rank"]) is None:
            return False  # its output is not in this log: it may have timed out too
    return True

def orphans_to_root_cause(ctx, out: list) -> None:
    """A cause printed with no rank (an unprefixed traceback, a transport's error) belongs
    to the one rank the launcher reports as failed first with no cause of its own."""
    ranked = {r for _, f in out for r in f.ranks if f.details.get("rule") != "rank_exit"}
    alive = [e for e in ctx.exits.values() if e["rank"] >= 0 and not e.get("torn_down")]
    # the root-cause entry; with no table, the one rank the launcher reports failed
    roots = [e for e in alive if e.get("root_cause")] or (alive if len(alive) == 1 else [])
    failed = [e for e in roots if e["rank"] not in ranked]
    unranked = [f for _, f in out if not f.ranks and "received_on" not in f.details
                and f.details.get("rule") not in ("launcher_signaled", "launcher_missing")]
    # a traceback first; else any one cause the log names with no rank (a restarted
    # round's "Gloo connectFullMesh failed", printed by ranks that never got a prefix)
    orphans = [f for f in unranked if f.kind == "crash"] or unranked
    if len(failed) == 1 and len(orphans) == 1:
        rank = failed[0]["rank"]
        f = orphans[0]
        f.ranks = [rank]
        f.summary = f"rank {rank}: {f.summary}"
        _drop_exit_of(out, rank)
        return
    # a message larger than the posted buffer aborts the rank that *received* it: its
    # exit is the mismatch's doing, and it is where the mismatch was seen, not its cause
    seen = [f for _, f in out if not f.ranks and "received_on" in f.details
            and not f.details["received_on"]]
    if len(failed) == 1 and len(seen) == 1:
        rank = failed[0]["rank"]
        f = seen[0]
        f.details["received_on"] = [rank]
        f.summary += f"; rank {rank} received it and aborted"
        _drop_exit_of(out, rank)
        return
    _local_exit_to_its_cause(ctx, out, [f for f in unranked
                                        if f.details.get("rule") != "rank_exit"])


def _local_exit_to_its_cause(ctx, out: list, unranked: list) -> None:
    """A node's agent reporting "local_rank: L" failed (no global rank in the log) and one
    cause printed by that node's local rank L ("1: [default0]:" under srun): one failure,
    said by the cause, with the process named as the log names it."""
    local = [e for e in ctx.exits.values() if e["rank"] <= -1000 and "local_rank" in e]
    if len(local) != 1 or len(unranked) != 1:
        return
    e, f = local[0], unranked[0]
    task = e["line"].rank if e["line"].host is None else None
    node = e["line"].host or (f"node{task}" if task is not None else None)
    who = ctx.first_lines_who(f) if hasattr(ctx, "first_lines_who") else None
    if node is None or who != ("local", node, e["local_rank"]):
        return
    f.summary = (f"local rank {e['local_rank']} on {node} (its global rank is not in this "
                 f"log): {f.summary}")
    f.details["local_rank"], f.details["node"] = e["local_rank"], node
    out[:] = [(o, g) for o, g in out
              if not (g.details.get("rule") == "rank_exit" and not g.ranks
                      and g.details.get("exit", {}).get("local_rank") == e["local_rank"])]



def _drop_exit_of(out: list, rank: int) -> None:
    """The launcher's bare "rank R exited" finding goes: another finding now says why."""
    out[:] = [(o, g) for o, g in out
              if not (g.details.get("rule") == "rank_exit" and g.ranks == [rank])]
