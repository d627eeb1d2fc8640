"""The c10d store and rendezvous: a port already taken, a store nobody answers at, ranks that
never joined, a key nobody wrote, a store that went away."""

from __future__ import annotations

import re

from distdoctor.findings import Finding
from distdoctor.logs import remedies as R
from distdoctor.logs.bounds import small_int
from distdoctor.logs.lines import LogLine
from distdoctor.logs.problems import (
    Problem,
    clip,
    exception_prefix,
    on,
    plural,
    ranks_text,
)
from distdoctor.logs.signals import (
    BENIGN,
    CAUSE,
    TIMEOUT,
    VICTIM,
    Family,
    Signal,
    rule,
    short_of,
    then,
)

NAME = "store"

RULES = (
    # torch/csrc/distributed/c10d/socket.cpp, 2.2+: "... port: 29500, useIpv6: false, code:
    # -98, name: EADDRINUSE"; older: "failed to bind to [::]:29500 (errno: 98 - Address ...)"
    # (the port and its EADDRINUSE a few words apart: a port followed by no EADDRINUSE would
    # otherwise send a scan to the line's end from each "port:")
    rule("port_in_use", NAME, CAUSE,
         then(r"server socket has failed to (?:listen|bind)|failed to bind") + r""
         r"(?:port: (?P<port>\d+).{0,400}?EADDRINUSE|:(?P<port2>\d+) \(errno: 98|"
         r"(?:EADDRINUSE|[Aa]ddress already in use))", ints=("port", "port2")),
    rule("port_in_use", NAME, CAUSE,
         then("EADDRINUSE") + r"port[: ]+(?P<port>\d+)|"
         + then("[Aa]ddress already in use") + r"port[: ]+(?P<port2>\d+)",
         ints=("port", "port2")),
    # the bind failed on an address this host does not have (MASTER_ADDR of another host)
    rule("listen_addr", NAME, CAUSE,
         then(r"server socket has failed to (?:listen|bind)") + r"(?:EADDRNOTAVAIL|"
         r"errno: 99|[Cc]annot assign requested address)"),
    # the store gave up listening (its errno may be on other lines, or cut off)
    rule("port_in_use", NAME, CAUSE,
         r"server socket has failed to listen on any local network address"
         r"(?:.*?port:? (?P<port>\d+))?", ints=("port",)),
    rule("connect_timeout", NAME, CAUSE,
         r"client socket has timed out after (?P<after>\d+(?:ms|s)) while trying to connect "
         r"to \(?(?P<host>[^,()\s]+)(?:, |:)(?P<port>\d+)\)?", ints=("port",)),
    rule("connect_failed", NAME, CAUSE,
         r"client socket has failed to connect to (?:any network address of )?"
         r"\(?\[?(?P<host>[^,()\s\]]+)\]?(?:, |:)(?P<port>\d+)\)?", ints=("port",)),
    rule("rdzv_connection", NAME, CAUSE,
         r"RendezvousConnectionError|connection to the C10d store has failed"),
    rule("join_timeout", NAME, TIMEOUT,
         r"Timed out after (?P<secs>\d+) seconds waiting for clients\. "
         r"(?P<joined>\d+)/(?P<world>\d+) clients joined", ints=("secs", "joined", "world")),
    # c10d's store-based barrier (init_process_group before 2.0, new_group)
    rule("barrier_timeout", NAME, TIMEOUT,
         r"Timed out initializing process group in store based barrier on rank:? "
         r"(?P<rank>\d+), for key: (?P<keys>\S+) \(world_size=(?P<world>\d+), "
         r"(?:worker_count|num_workers_joined)=(?P<joined>\d+)",
         ints=("rank", "world", "joined")),
    rule("rdzv_timeout", NAME, TIMEOUT,
         r"RendezvousTimeoutError|rendezvous (?:timed out|has timed out)|"
         r"[Tt]imed out (?:while )?waiting for (?:the )?rendezvous"),
    rule("rdzv_closed", NAME, VICTIM, r"RendezvousClosedError"),
    # ProcessGroupNCCL: "[1] is setting up NCCL communicator and retrieving ncclUniqueId from
    # [0] via c10d key-value store by key '0', but store->get('0') got error: Socket Timeout"
    rule("unique_id_timeout", NAME, TIMEOUT,
         r"retrieving ncclUniqueId from \[(?P<owner>\d+)\]" + short_of("retrieving ncclUniqueId")
         + r"got error(?:: (?P<error>.*))?",
         ints=("owner",)),
    rule("key_timeout", NAME, TIMEOUT,
         r"wait timeout after (?P<ms>\d+)ms(?:, keys: (?P<keys>.*))?", ints=("ms",)),
    # store.wait()'s bare error: the barrier's loop catches it to log and raises its own
    # (above), chained to it; said once, by that one
    rule("inner_wait", NAME, BENIGN, r"DistStoreError: [Ww]ait timeout\s*$"),
    # (no "(DistStoreError|store).*?" before the words: optional, it changed no match, and
    # sent a scan to the line's end from each "store")
    rule("key_timeout", NAME, TIMEOUT,
         r"(?:Socket Timeout|[Tt]imeout waiting for key|timed out waiting for key)"
         r"(?:.*?key[s]?[: ]+(?P<keys>\S+))?"),
    rule("store_gone", NAME, VICTIM,
         then(r"TCPStore|DistStoreError|DistNetworkError|c10d") + r"(?:failed to "
         r"recv, got 0 bytes|Connection reset by peer|Broken pipe|Connection closed by peer)"),
)

class StoreFamily(Family):
    name = NAME
    anchors = (b"socket has", b"failed to bind", b"EADDRINUSE", b"already in use",
               b"Rendezvous", b"endezvous", b"clients joined", b"wait timeout",
               b"Socket Timeout", b"imeout waiting for key", b"failed to recv", b"C10d store",
               b"store based barrier", b"ncclUniqueId", b"by peer", b"Broken pipe",
               b"DistStoreError: ")
    rules = RULES

    def feed(self, line: LogLine) -> list[Signal]:
        out = super().feed(line)
        for s in out:
            f = s.fields
            if "port2" in f:
                f.setdefault("port", f.pop("port2"))
            keys = f.get("keys")
            if keys:
                f["keys"] = keys.strip()[:200]
        return out


# --- what its problems mean ---------------------------------------------------------------
def prepare(causes: list[Problem]) -> list[Problem]:
    """A rendezvous that could not reach its store is one problem with that connection
    failure (its inner error), named after the rendezvous' exception."""
    rdzv = next((p for p in causes if p.rule == "rdzv_connection"), None)
    connect = next((p for p in causes if p.rule in ("connect_timeout", "connect_failed")), None)
    if rdzv and connect:
        connect.signals[0].fields.setdefault("exception", "RendezvousConnectionError")
        return [p for p in causes if p is not rdzv]
    return causes


def went_on(p: Problem, ctx) -> str | None:
    """torch warns (W) while it retries a bind or a connect, and errs (E) when it gives up:
    warnings alone are a start-up that went on, info at most."""
    if p.rule in ("connect_failed", "port_in_use") and all(
            s.line.level in ("W", "WARNING", "I", "INFO") for s in p.signals):
        return "info"
    return None


def describe(p: Problem, ctx) -> Finding:
    f, ranks = p.first.fields, sorted(p.ranks)
    retried = went_on(p, ctx) is not None  # then it blames nobody
    where_on = on(ranks)
    if p.rule == "listen_addr":
        return ctx.finding(p, "comm_error", "error", f"the c10d store could not listen: "
                           f"MASTER_ADDR is not an address of this host{where_on} "
                           f"({clip(p.first.line.text, 120)})", ranks, R.STORE_ADDR)
    if p.rule == "port_in_use":
        # only the store's server listens: with no launcher in the log (env://), rank 0
        if not ranks and not ctx.exits and not p.field("in_launcher") \
                and not ctx.launcher_seen and not retried:
            ranks, where_on = [0], " on rank 0, which hosts the store under env://"
        return ctx.finding(p, "comm_error", "error", f"c10d store port {p.field('port', '?')} is "
                           f"already in use (EADDRINUSE){where_on}", [] if retried else ranks,
                           R.PORT_IN_USE)
    at = f" at {f['host']}:{f.get('port', '?')}" if "host" in f else ""
    after = f" (timed out after {f['after']})" if "after" in f else ""
    # under env:// rank 0 hosts the store: when every client is another rank, it was down
    host = [0] if ranks and 0 not in ranks and p.rule != "rdzv_connection" \
        and not retried else []
    who = "; rank 0, which hosts the store, was not listening" if host else ""
    if bad := _not_a_host(p):
        host, who = [], f"; {bad}"
    return ctx.finding(p, "comm_error", "error", f"{exception_prefix(p)}could not reach the c10d "
                       f"store{at}{after}{where_on}{who}", host, R.STORE_CONNECT)


def owners(p: Problem, ctx) -> tuple[list[int], str] | None:
    """The ranks a store timeout names, and how: the writer of the key (c10d's group keys end
    in the rank, ".../cpu//0/3"; users' keys often say "rank1/..."), NCCL's unique id (rank
    0's), and with only the store's own client joined (1/N) under env://, ranks 1..N-1."""
    ranks = _owners(p, ctx)
    if not ranks:
        return None
    verb = "joined" if p.rule == "join_timeout" else "wrote it"
    return ranks, f"; rank{plural(ranks)} {ranks_text(ranks)} never {verb}"


def _owners(p: Problem, ctx) -> list[int]:
    if p.rule == "unique_id_timeout":
        owner = p.field("owner")
        return [owner] if owner is not None and owner not in p.ranks else []
    if p.rule == "join_timeout":
        where = str((p.field("where") or {}).get("file", ""))
        world = p.field("world") or 0
        if p.field("joined") != 1 or p.field("in_launcher") or "torchrun" in where:
            return []  # torchrun's agents are the store's clients: nodes, not ranks
        return list(range(1, world)) if 1 < world <= 16 else []
    if p.rule != "key_timeout" or not p.field("keys"):
        return []
    key = str(p.field("keys")).strip("[]'\" ")
    m = re.search(r"rank[_-]?(\d+)", key, re.I) or re.search(r"/(\d+)$", key)
    if not m:
        return []
    rank = small_int(m.group(1))
    if rank is None:
        return []
    limit = ctx.ev.world or (max(ctx.ev.ranks) + 2 if ctx.ev.ranks else 2)
    return [rank] if rank < limit and rank not in p.ranks else []


def _join(p: Problem) -> str:
    f = p.fields()
    return (f"{exception_prefix(p)}rendezvous incomplete: {f.get('joined')}/{f.get('world')} "
            f"clients joined the c10d store in {f.get('secs')} s")


def _barrier(p: Problem) -> str:
    f = p.fields()
    return (f"the store-based barrier of init_process_group/new_group timed out: "
            f"{f.get('joined')} of {f.get('world')} ranks arrived (key {f.get('keys')})")


def _unique_id(p: Problem) -> str:
    error = clip(p.field("error", ""), 60) or "the log cuts off its error"
    return f"ranks waited for rank {p.field('owner')}'s NCCL unique id in the c10d store ({error})"


def _key(p: Problem) -> str:
    keys = f" for key {p.field('keys')}" if p.field("keys") else ""
    return f"{exception_prefix(p)}c10d store wait timeout{keys}: a rank never wrote it"


TIMEOUTS = {
    "join_timeout": (_join, R.STORE_JOIN),
    "rdzv_timeout": (lambda p: f"{exception_prefix(p)}the rendezvous timed out: not every "
                               f"node joined", R.RDZV_TIMEOUT),
    "barrier_timeout": (_barrier, R.STORE_JOIN),
    "unique_id_timeout": (_unique_id, R.STORE_KEY),
    "key_timeout": (_key, R.STORE_KEY),
}
# a store timeout is about starting up, except a key a rank never wrote: that rank hangs
NOT_A_HANG = ("join_timeout", "rdzv_timeout", "barrier_timeout")
VICTIMS = {"store_gone": "lost the connection to the c10d store",
           "rdzv_closed": "the rendezvous was closed"}


# an address no host has: "this network" (0.0.0.0/8), which a host name made of digits
# becomes when a resolver reads it as a 32-bit number ("6841231" -> 0.104.99.143)
_ZERO_NET = re.compile(r"^(?:::ffff:)?0\.\d+\.\d+\.\d+$")


def _not_a_host(p: Problem) -> str:
    hosts = {str(s.fields["host"]).strip("[]") for s in p.signals if s.fields.get("host")}
    digits = sorted(h for h in hosts if h.isdigit())
    zero = sorted(h for h in hosts if _ZERO_NET.match(h))
    if not (digits or zero):
        return ""
    name = f"the host name {digits[0]} is all digits: " if digits else ""
    return (f"{name}the store's address resolved to {zero[0] if zero else 'a number'}, which "
            f"no host has (a numeric hostname read as an IPv4 number): set MASTER_ADDR / "
            f"--master_addr to a real address or rename the host")
