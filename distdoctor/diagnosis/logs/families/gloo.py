"""Gloo: a rank that waited past the timeout, a peer that left mid-collective, a peer that
could not be reached."""

from __future__ import annotations

from distdoctor.diagnosis.findings import Finding
from distdoctor.diagnosis.logs import remedies as R
from distdoctor.diagnosis.logs.problems import Problem, on, secs
from distdoctor.diagnosis.logs.signals import CAUSE, TIMEOUT, VICTIM, Family, rule

NAME = "gloo"

RULES = (
    # gloo/transport/tcp/unbound_buffer.cc, pair.cc
    rule("gloo_timeout", NAME, TIMEOUT,
         r"Timed out waiting (?P<timeout_ms>\d+)ms for (?P<op>\w+) operation",
         ints=("timeout_ms",)),
    rule("gloo_peer_gone", NAME, VICTIM,
         r"(?:gloo|pair\.cc|Read error|Write error).*?(?:Connection closed by peer|"
         r"Connection reset by peer|Broken pipe)(?: \[?(?P<peer>[\w.:\[\]-]+)\]?)?"),
    rule("gloo_connect", NAME, CAUSE,
         r"(?:[Gg]loo|connectFullMesh).*?(?:Connection refused|Connect timeout|getaddrinfo|"
         r"No route to host|connectFullMesh failed)"),
    rule("gloo_connect", NAME, CAUSE,
         r"Unable to resolve hostname to a \(local\) address"),
)


class GlooFamily(Family):
    name = NAME
    anchors = (b"Timed out waiting", b"by peer", b"Broken pipe", b"connectFullMesh",
               b"Connection refused", b"Connect timeout", b"getaddrinfo", b"No route to host",
               b"resolve hostname")
    rules = RULES


# --- what its problems mean ---------------------------------------------------------------
def describe(p: Problem, ctx) -> Finding:
    return ctx.finding(p, "comm_error", "error", f"Gloo could not connect to a peer"
                       f"{on(sorted(p.ranks))}", sorted(p.ranks), R.SOCKET)


def _timeout_text(p: Problem) -> str:
    ops = sorted({s.fields["op"] for s in p.signals if "op" in s.fields})
    return (f"Gloo timed out after {secs(p.field('timeout_ms', 0))} waiting for a "
            f"{'/'.join(ops) or '?'}")


TIMEOUTS = {"gloo_timeout": (_timeout_text, R.GLOO_TIMEOUT)}
VICTIMS = {"gloo_peer_gone": "Gloo lost a peer mid-collective (connection closed)"}
