"""A peer's death seen through the network. When a rank dies (a segfault, an exception, an
OOM kill), the ranks still in a collective with it see its queue pairs and sockets go away:
NCCL's `ncclRemoteError` with "Last error: NET/IB : Got completion from peer 10.0.0.7<4312>
with status=12" (the retry count exceeded on a peer that no longer answers), a network
plugin's failed request. Those lines name the network, and the ranks that print them are
where the death was seen, not where it happened: where the log shows another rank's crash,
that crash is the cause and the transport errors are its consequences (one finding). With no
crash elsewhere in the log they stay what they say: the fabric failed.
"""

from __future__ import annotations

from distdoctor.findings import Finding
from distdoctor.logs.problems import plural, ranks_text

# exits that follow a transport failure rather than cause one: NCCL's abort (SIGABRT) after
# its error, the launcher's SIGTERM to the survivors
_AFTERMATH = (6, 15)


def transport_to_crash(out: list[tuple[float, Finding]]) -> None:
    """Folds, in place, each transport error that ranks reported into the one crash of
    another rank the log shows."""
    crashes = [f for _, f in out if f.kind == "crash" and f.severity == "error" and f.ranks
               and (f.details.get("exit") or {}).get("signum") not in _AFTERMATH]
    if not crashes:
        return
    for o, t in list(out):
        if not _seen_from_a_peer(t):
            continue
        others = [c for c in crashes if not set(c.ranks) & set(t.ranks)]
        if len({tuple(c.ranks) for c in others}) != 1:
            continue  # none, or several ranks crashed: which one they lost is not told
        cause = others[0]
        seen = (f" (seen by rank{plural(t.ranks)} {ranks_text(t.ranks)})" if t.ranks else "")
        cons = cause.details.setdefault("consequences", [])
        if len(cons) < 20:
            cons.append({"rule": t.details.get("rule"), "summary": t.summary,
                         "reporting_ranks": list(t.ranks), "count": t.details.get("count", 1)})
        if "; then" not in cause.summary:
            cause.summary += f"; then the others lost it: NCCL transport errors{seen}"
        out.remove((o, t))


def _seen_from_a_peer(t: Finding) -> bool:
    """NCCL's transport errors that a peer's death produces too (nccl.py's rules): an IB work
    completion from a named peer, a network plugin's failed request."""
    if t.details.get("family") != "nccl":
        return False
    rule = t.details.get("rule")
    text = " ".join([t.summary, *t.details.get("lines", [])])
    return rule == "net_request" or rule == "ib" and "completion from peer" in text
