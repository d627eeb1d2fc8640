"""The c10d store and rendezvous: a port already taken, a store nobody answers at, ranks that
never joined, a key nobody wrote, a store that went away."""

from __future__ import annotations

from distdoctor.diagnosis.logs.lines import LogLine
from distdoctor.diagnosis.logs.signals import CAUSE, TIMEOUT, VICTIM, Family, Signal, rule

NAME = "store"

RULES = (
    # torch/csrc/distributed/c10d/socket.cpp, 2.2+: "... port: 29500, useIpv6: false, code:
    # -98, name: EADDRINUSE"; older: "failed to bind to [::]:29500 (errno: 98 - Address ...)"
    rule("port_in_use", NAME, CAUSE,
         r"(?:server socket has failed to (?:listen|bind)|failed to bind).*?"
         r"(?:port: (?P<port>\d+).*?EADDRINUSE|:(?P<port2>\d+) \(errno: 98|"
         r"(?:EADDRINUSE|[Aa]ddress already in use))", ints=("port", "port2")),
    rule("port_in_use", NAME, CAUSE,
         r"EADDRINUSE.*?port[: ]+(?P<port>\d+)|[Aa]ddress already in use.*?port[: ]+(?P<port2>\d+)",
         ints=("port", "port2")),
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
         r"retrieving ncclUniqueId from \[(?P<owner>\d+)\].*?got error: (?P<error>.*)",
         ints=("owner",)),
    rule("key_timeout", NAME, TIMEOUT,
         r"wait timeout after (?P<ms>\d+)ms(?:, keys: (?P<keys>.*))?", ints=("ms",)),
    rule("key_timeout", NAME, TIMEOUT,
         r"(?:DistStoreError|TCPStore|store).*?(?:Socket Timeout|[Tt]imeout waiting for key|"
         r"timed out waiting for key)(?:.*?key[s]?[: ]+(?P<keys>\S+))?"),
    rule("store_gone", NAME, VICTIM,
         r"(?:TCPStore|DistStoreError|DistNetworkError|c10d).*?(?:failed to recv, got 0 bytes|"
         r"Connection reset by peer|Broken pipe|Connection closed by peer)"),
)

class StoreFamily(Family):
    name = NAME
    anchors = (b"socket has", b"failed to bind", b"EADDRINUSE", b"already in use",
               b"Rendezvous", b"endezvous", b"clients joined", b"wait timeout",
               b"Socket Timeout", b"imeout waiting for key", b"failed to recv", b"C10d store",
               b"store based barrier", b"ncclUniqueId", b"by peer", b"Broken pipe")
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
