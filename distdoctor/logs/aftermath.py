"""The store lost after the ranks lost their peers. A rank on another node fails; the ranks
of this node lose it mid-collective (Gloo's "Connection closed by peer", NCCL's remote error
or watchdog timeout); that node's agent exits, and with it the rendezvous store it hosted;
this node's agent, tearing its workers down, then cannot reach the store ("has failed to
shutdown the rendezvous ... RendezvousConnectionError", "DistNetworkError: Failed to recv,
got 0 bytes"). Recorded here with two torchrun agents (c10d rendezvous) whose one worker
raised: the log of the other node said "could not reach the c10d store" as its cause. A store
failure with no rank printed after ranks already lost peers or timed out is what the job's
end did to the store, said beside the failure those ranks saw, never as the cause.
"""

from __future__ import annotations

import re

from distdoctor.findings import Finding
from distdoctor.logs.signals import TIMEOUT, VICTIM

_STORE_RULES = ("rdzv_connection", "connect_failed", "connect_timeout", "store_gone")
# (a bounded run of word characters: `\w*` backtracked over a long word, quadratic)
_STORE_ERRORS = re.compile(r"DistNetworkError|DistStoreError|Rendezvous\w{0,40}Error")
_LOST = ("gloo", "nccl")  # the families whose victims and timeouts say peers were lost


def store_after_peers_lost(ctx, out: list[tuple[float, Finding]]) -> tuple:
    """Takes out of `out` the rankless store failures printed after ranks lost peers or
    timed out; returns where that began and them, for `said_beside` once those ranks'
    finding is made."""
    lost = [p.first.order for p in ctx.problems.values() if p.role in (VICTIM, TIMEOUT)
            and p.family in _LOST and p.ranks]
    if not lost:
        return None, []
    first = min(lost)
    return first, _take(out, first)


def said_beside(out: list[tuple[float, Finding]], taken: tuple) -> None:
    """The store failures taken out, and the store's loss the rankless launcher reported
    as a victim after the same moment, as consequences of the first error left (or put
    back where no finding is left to hold them)."""
    first, later = taken
    if first is None:
        return
    later += _take(out, first)
    errors = sorted((x for x in out if x[1].severity == "error"), key=lambda x: x[0])
    if not later or not errors:
        out.extend(later)
        return
    cause = errors[0][1]
    cons = cause.details.setdefault("consequences", [])
    for _, f in later:
        if len(cons) < 20:
            cons.append({"rule": f.details.get("rule"), "summary": f.summary,
                         "reporting_ranks": [], "count": f.details.get("count", 1)})
    cause.summary += ("; then this node's launcher lost the rendezvous store too (its host "
                      "went away as the job ended)")


def _take(out: list, first: float) -> list:
    later = [x for x in out if x[0] > first and not x[1].ranks and _store_side(x[1])]
    out[:] = [x for x in out if not any(x[1] is y[1] for y in later)]
    return later


def _store_side(f: Finding) -> bool:
    d = f.details
    if d.get("family") == "store":
        return d.get("rule") in _STORE_RULES
    return d.get("family") == "exception" and bool(_STORE_ERRORS.search(d.get("exception", "")))
