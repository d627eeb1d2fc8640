"""NCCL's lost peer named: the host or address whose end of a socket closed (nccl.py's
remote errors) is the peer that died first, and its rank where the log tells."""

from __future__ import annotations

from distdoctor.findings import Finding
from distdoctor.logs import remedies as R
from distdoctor.logs.bounds import every_rank
from distdoctor.logs.problems import Problem, clip


def victim_culprit(p: Problem, ctx) -> Finding | None:
    """A peer NCCL's socket names (the host or address whose end closed): it died first.
    Its rank is named where the log tells: the one rank seen on that host, or the one rank
    of the world the log shows nowhere else."""
    if p.rule != "remote_error":
        return None
    peers = {s.fields["peer"] for s in p.signals if s.fields.get("peer")}
    if len(peers) != 1:
        return None
    peer = peers.pop()
    ev = ctx.ev
    on_peer = sorted(r for r, h in ev.hosts_of.items() if h == peer)
    ranks = on_peer if len(on_peer) == 1 else []
    if not on_peer and ev.world and peer not in ev.hosts_of.values():
        unseen = set(every_rank(0, ev.world)) - ev.ranks - set(ev.hosts_of) - p.ranks
        ranks = sorted(unseen) if len(unseen) == 1 else []
    who = f"rank {ranks[0]} on {peer}" if ranks else f"the peer on {peer}"
    seen = f" (seen by rank{'s' if len(p.ranks) > 1 else ''} " \
           f"{', '.join(map(str, sorted(p.ranks)))})" if p.ranks else ""
    line = next((s.line.text for s in p.signals if s.fields.get("peer")), "")
    i = line.find("NCCL WARN")
    fnd = ctx.finding(p, "comm_error", "error", f"{who} went away mid-collective: NCCL's "
                      f"connection to it was closed from its end{seen} "
                      f"({clip(line[i + 9:] if i >= 0 else line, 100)}); that peer died or "
                      f"was killed first", ranks, R.NCCL_REMOTE)
    fnd.details["peer"] = peer
    return fnd
