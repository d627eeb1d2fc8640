"""Gloo: a rank that waited past the timeout, a peer that left mid-collective, a peer that
could not be reached."""

from __future__ import annotations

import re

from distdoctor.findings import Finding
from distdoctor.logs import remedies as R
from distdoctor.logs.problems import (
    Problem,
    clip,
    on,
    plural,
    rank_of,
    ranks_text,
    secs,
    short_path,
)
from distdoctor.logs.signals import CAUSE, TIMEOUT, VICTIM, Family, rule, then

NAME = "gloo"

RULES = (
    # gloo/transport/tcp/unbound_buffer.cc, pair.cc
    rule("gloo_timeout", NAME, TIMEOUT,
         r"Timed out waiting (?P<timeout_ms>\d+)ms for (?P<op>\w+) operation",
         ints=("timeout_ms",)),
    rule("gloo_peer_gone", NAME, VICTIM,
         then(r"gloo|pair\.cc|Read error|Write error") + r"(?:Connection closed by "
         r"peer|Connection reset by peer|Broken pipe)(?: \[?(?P<peer>[\w.:\[\]-]+)\]?)?"),
    rule("gloo_connect", NAME, CAUSE,
         then(r"[Gg]loo|connectFullMesh") + r"(?:Connection refused|Connect timeout|"
         r"getaddrinfo|No route to host|connectFullMesh failed)"),
    rule("gloo_connect", NAME, CAUSE,
         r"Unable to resolve hostname to a \(local\) address"),
    # gloo/transport/tcp/pair.cc: a message longer than the buffer the receiver posted (the
    # ranks disagree on an op's size); an enforce failure that aborts the receiving rank
    rule("gloo_size_mismatch", NAME, CAUSE,
         r"(?:(?<!\d)(?P<got>\d{1,18}) vs (?P<want>\d{1,18})\. )?Received data size doesn't "
         r"match expected size",
         ints=("got", "want")),
    # (older gloo: "[enforce fail at .../pair.cc:446] op.preamble.length <= op.nbytes. A vs B")
    rule("gloo_size_mismatch", NAME, CAUSE,
         r"op\.preamble\.length <= op\.nbytes\. (?P<got>\d+) vs (?P<want>\d+)",
         ints=("got", "want")),
    # gloo/transport/tcp/device.cc: GLOO_SOCKET_IFNAME names an interface this host lacks
    rule("gloo_iface", NAME, CAUSE, r"Unable to find address for: (?P<iface>[\w.:@-]+)"),
)
# the peer a point-to-point call in the user's own line talks to: "dist.recv(tensor, 0)",
# "dist.send(t, dst=3)", "recv(buf, src=1)", "broadcast(t, src=0)"
# (the first argument runs to its comma through one call's parentheses: "recv(t(x), 0)"; no
# two runs there take the same characters, so a line of blanks is read once)
_PEER_CALL = re.compile(r"\b(?:i?recv|i?send|broadcast|scatter|gather)\(\s*[^,()\s][^,()]*"
                        r"(?:\([^()]*\)[^,()]*)?,\s*(?:src=|dst=)?(?P<peer>\d{1,18})\s*[,)]|"
                        r"\b(?:src|dst)=(?P<kw>\d{1,18})")


class GlooFamily(Family):
    name = NAME
    anchors = (b"Timed out waiting", b"by peer", b"Broken pipe", b"connectFullMesh",
               b"Unable to find address", b"Received data size", b"op.preamble.length",
               b"Connection refused", b"Connect timeout", b"getaddrinfo", b"No route to host",
               b"resolve hostname")
    rules = RULES


# --- what its problems mean ---------------------------------------------------------------
def describe(p: Problem, ctx) -> Finding:
    if p.rule == "gloo_iface":
        iface = p.field("iface", "?")
        fnd = ctx.finding(p, "comm_error", "error", f"GLOO_SOCKET_IFNAME={iface}: Gloo found no "
                          f"address for interface {iface} on this host (no such interface, or "
                          f"it has no IP), so init_process_group failed"
                          f"{on(sorted(p.ranks)) or ' on every rank'}", sorted(p.ranks),
                          "Set GLOO_SOCKET_IFNAME to an interface every node has (`ip -br "
                          "addr` lists them; the one that reaches the other nodes), or unset "
                          "it. `distdoctor check` tests it before the job starts.")
        fnd.details["variable"] = "GLOO_SOCKET_IFNAME"
        return fnd
    if p.rule == "gloo_size_mismatch":
        # printed by the rank that *received*: a victim of the sender (or of the rank whose
        # op had another size), so it names no culprit; the receiver goes in details
        sizes = (f" ({p.field('got')} bytes arrived for a {p.field('want')}-byte buffer)"
                 if p.field("want") is not None else "")
        where = f" on rank{'s' if len(p.ranks) > 1 else ''} {', '.join(map(str, sorted(p.ranks)))}" \
            if p.ranks else ""
        fnd = ctx.finding(p, "mismatch", "error", f"Gloo received more data than the "
                          f"receiving buffer holds{sizes}{where}: the ranks disagree on an "
                          "op's size (a collective or send/recv mismatch); the rank that "
                          "sent it, or whose op had another size, is the cause", [],
                          R.MISMATCH)
        fnd.details["received_on"] = sorted(p.ranks)
        return fnd
    return ctx.finding(p, "comm_error", "error", f"Gloo could not connect to a peer"
                       f"{on(sorted(p.ranks))}", sorted(p.ranks), R.SOCKET)


def victim_culprit(p: Problem, ctx) -> Finding | None:
    """Ranks that lost a peer inside their own point-to-point call name it in their frame
    ("dist.recv(tensor, 0)"): the peer that is not itself one of them left first."""
    if p.rule != "gloo_peer_gone":
        return None
    named: dict[int, tuple[int, dict]] = {}
    for s in p.signals:
        where = s.fields.get("where") or {}
        m = _PEER_CALL.search(where.get("source", ""))
        r = rank_of(s.line)
        if m and (r is not None or not p.ranks):  # (one unlabelled process: it is not
            named[-1 if r is None else r] = (int(m["peer"] or m["kw"]), where)  # its peer)
    peers = {peer for peer, _ in named.values()} - set(named) - p.ranks
    if len(peers) != 1:
        return None
    peer = peers.pop()
    waiting = sorted(r for r, (q, _) in named.items() if q == peer)
    where = named[waiting[0]][1]
    who = f"rank{plural(waiting)} {ranks_text(waiting)}" if waiting[0] >= 0 else "a rank"
    fnd = ctx.finding(p, "comm_error", "error", f"rank {peer} went away while "
                      f"{who} waited on it: Gloo's connection "
                      f"was closed by peer in `{clip(where.get('source', ''), 60)}` "
                      f"({short_path(where.get('file', '?'))}:{where.get('line')}); rank "
                      f"{peer} exited or died first", [peer], R.PEER_LEFT)
    fnd.callsites = [{"rank": r, **{k: v for k, v in named[r][1].items() if k != "source"}}
                     for r in waiting[:8] if r >= 0]
    return fnd


def _timeout_text(p: Problem) -> str:
    ops = sorted({s.fields["op"] for s in p.signals if "op" in s.fields})
    return (f"Gloo timed out after {secs(p.field('timeout_ms', 0))} waiting for a "
            f"{'/'.join(ops) or '?'}")


TIMEOUTS = {"gloo_timeout": (_timeout_text, R.GLOO_TIMEOUT)}
VICTIMS = {"gloo_peer_gone": "Gloo lost a peer mid-collective (connection closed)"}
