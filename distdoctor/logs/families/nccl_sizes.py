"""NCCL's "message truncated": a peer sent more bytes than this rank posted for the op
(NET/Socket's "peer 10.0.0.8<51422> message truncated : receiving 1048576 bytes instead of
65536"; NET/IB's and the bootstrap's "Message truncated : received 1024 bytes instead of
256"), under an "internal error" (NCCL before 2.12) or an "invalid usage" (since). NCCL's own
words for it (transport/net_socket.cc, 2.12+): a mismatch in collective sizes or in
environment settings (NCCL_PROTO, NCCL_ALGO) between ranks; not the network, not a version
skew. The rank that printed it is where the wrong size arrived, not its cause: no culprit,
the receiver in details, as for Gloo's "Received data size" (gloo.py)."""

from __future__ import annotations

from distdoctor.findings import Finding
from distdoctor.logs.problems import Problem, plural, ranks_text
from distdoctor.logs.signals import CAUSE, Family, rule

NAME = "nccl_size"

RULES = (
    rule("size_mismatch", NAME, CAUSE,
         r"[Mm]essage truncated\s*:\s*receiv(?:ing|ed) (?P<got>\d{1,18}) bytes instead of "
         r"(?P<want>\d{1,18})", ints=("got", "want")),
)

REMEDY = ("The ranks disagree on an operation's size: one rank called a collective (or a "
          "send/recv) with another tensor size or count, or in another order, than its peers "
          "(a data-dependent shape, an uneven last batch, a branch on the rank); rerun with "
          "TORCH_DISTRIBUTED_DEBUG=DETAIL or under `distdoctor run` to see each rank's op and "
          "shape. Else NCCL's settings differ between ranks or nodes: make NCCL_PROTO, "
          "NCCL_ALGO and the NCCL version the same everywhere.")


class NcclSizeFamily(Family):
    name = NAME
    anchors = (b"essage truncated",)
    rules = RULES


def describe(p: Problem, ctx) -> Finding:
    f, ranks = p.first.fields, sorted(p.ranks)
    sizes = (f" ({f['got']:,} bytes arrived for a {f['want']:,}-byte slot)"
             if "got" in f and "want" in f else "")
    seen = f" (seen by rank{plural(ranks)} {ranks_text(ranks)})" if ranks else ""
    fnd = ctx.finding(p, "mismatch", "error", f"NCCL received more data than it expected"
                      f"{sizes}{seen}: the ranks disagree on an op's size (a collective or "
                      f"send/recv of another size on some rank) or on NCCL's settings "
                      f"(NCCL_PROTO, NCCL_ALGO); the rank that sent it, not the one that "
                      f"printed it, is the cause", [], REMEDY)
    fnd.details["received_on"] = ranks
    return fnd
