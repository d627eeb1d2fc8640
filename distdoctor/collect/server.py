"""The collector: accepts the nodes' forwarding streams and keeps their copy (mirror.py).

One asyncio event loop serves every connection (serving.py): no thread per node, so a
flood of sockets costs descriptors within a budget, never threads. Connections that have
not authenticated yet have their own small budget and a deadline of a few seconds; a
node proves it holds the token by answering a challenge (auth.py), so the token never
crosses the wire. A node that sends a malformed frame, a wrong answer, or nothing for
IDLE_S is dropped with one line (refusals summed per peer and minute), and what it sent
before stays. One more thread for what only the collector sees: the digests' findings,
slow links between nodes (links.py), nodes lost while the others wait (lost.py), and ranks
that pass from one node to another or that two nodes send (claims.py).
"""

from __future__ import annotations

import ipaddress
import socket
import ssl
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from distdoctor.collect import tls
from distdoctor.collect.mirror import Mirror, NodeMirror
from distdoctor.collect.serving import AUTH_S, IDLE_S, MAX_NODES, MAX_PENDING, Serving
from distdoctor.errors import UserError

FLEET_TICK_S = 0.5
LOST_CHECK_S = 1.0  # while a node is silent: how often the others' positions are read
BACKLOG = 1024  # connections the kernel holds for accept(): a burst waits, not refused
_PARTS = {"_digests_pass": "the digests' findings", "_find_lost_nodes": "lost nodes",
          "_collector_pass": "slow links and lost nodes",
          "_let_go_evicted": "nodes let go to make room",
          "_owners_pass": "ranks that changed hands"}
__all__ = ["AUTH_S", "IDLE_S", "MAX_NODES", "MAX_PENDING", "Collector", "is_loopback",
           "listen", "parse_address"]


def parse_address(text: str, what: str) -> tuple[str, int]:
    """HOST:PORT (or [IPv6]:PORT) into (host, port), or a one-line UserError."""
    host, sep, port = text.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise UserError(f"{what}: expected HOST:PORT, got {text!r}", 2)
    return host, int(port)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def listen(address: tuple[str, int], settings: tls.TLSSettings | None = None,
           what: str = "watch") -> socket.socket:
    """The collector's socket (bound before anything is written: a port in use, or a TLS
    setting that cannot be used, leaves no run dir behind). With TLS (`settings`, else
    DISTDOCTOR_TLS_*) it is a TLS listener (the Collector does each handshake on its event
    loop), and a node that does not speak TLS gets nothing in."""
    settings = tls.settings() if settings is None else settings
    ctx = settings.server_context(what)
    try:
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        sock = socket.create_server(address, family=family, backlog=BACKLOG)
    except OSError as exc:
        raise UserError(f"{what}: cannot listen on {address[0]}:{address[1]}: "
                        f"{exc.strerror or exc}") from None
    if ctx is None:
        if not is_loopback(address[0]):
            print(f"distdoctor: {what}: no TLS on {address[0]}: the nodes' data travel in "
                  f"clear, readable and changeable on the way (the token does not: they "
                  f"answer a challenge; set {tls.CERT} and {tls.KEY})", file=sys.stderr)
        return sock
    return ctx.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)


class Collector:
    def __init__(self, run_dir: str | Path, listener: socket.socket, token: str | None,
                 say: Callable[[str], None], on_finding: Callable | None = None,
                 hang_timeout_s: float | None = None):
        """`say`: one line of news (a node came, went, was refused); `on_finding`: each
        finding a node forwards (the errors in its job's output). `listener`: listen()'s
        socket (a TLS one: its context does the handshakes)."""
        self.mirror = Mirror(run_dir, on_finding, hang_timeout_s)
        self.token = token
        self.say = say
        # host -> connections so far, and its newest one: of the hosts connected now and
        # those that own ranks (at most MAX_RANKS); a host gone that owns none is forgotten
        # (left) and its connections only counted, so host names cycled cost nothing kept
        self.nodes: dict[str, int] = {}
        self.streams: dict[str, NodeMirror] = {}
        self.rankless = 0  # connections of hosts forgotten so
        self.hang_timeout_s = hang_timeout_s
        self._lost: dict[str, object] = {}  # host -> its lost-node finding (kept)
        self._lost_checked_s = 0.0
        self._written = 0  # the fleet engine's findings version in findings.json
        self._said: list = []  # the collector's own findings as last written
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()  # every open connection's socket
        self._stopping = False
        context = None
        if isinstance(listener, ssl.SSLSocket):  # the loop wraps each connection itself
            context = listener.context
            listener = socket.socket(listener.family, listener.type, listener.proto,
                                     fileno=listener.detach())
        self.address = listener.getsockname()[:2]
        self._serving = Serving(self, listener, context, token)
        self._thread = threading.Thread(target=self._serving.run, name="distdoctor-collector",
                                        daemon=True)
        self._fleet_thread = threading.Thread(target=self._diagnose, daemon=True,
                                              name="distdoctor-fleet")

    def start(self) -> Collector:
        from distdoctor.collect.descriptors import raise_open_files_limit

        raise_open_files_limit()  # (what it says, if low, `watch --listen` prints)
        self._thread.start()
        self._fleet_thread.start()
        return self

    def connected(self, node: NodeMirror) -> None:
        """A node welcomed (on the loop)."""
        with self._lock:
            self.nodes[node.host] = self.nodes.get(node.host, 0) + 1
            self.streams[node.host] = node

    def left(self, node: NodeMirror) -> None:
        """The last connection of `node`'s host ended (on the loop). A host that owns no
        rank of the copy is forgotten: no rank waits for it (what a lost node is), no view
        shows it; a peer that cycles host names (3,000 of them held 3.4 MiB, and each was
        read again by every pass for lost nodes) costs nothing that stays."""
        if self.mirror.owners.count.get(node.host):
            return
        with self._lock:
            if self.streams.get(node.host) is node:
                del self.streams[node.host]
                self.rankless += self.nodes.pop(node.host, 0)

    def _diagnose(self) -> None:
        """What only the collector sees, into the copy's findings.json (and printed, by a
        service) as it appears: the findings over the digests' ranks, slow links between
        nodes (links.py), nodes lost while the others wait for them (lost.py). Each part
        of a pass is on its own: one that raises (a bug of ours, a full disk) is said
        once and tried again next pass, and the other parts go on."""
        from distdoctor.priority import lower_this_thread

        lower_this_thread()
        failed: set[tuple[str, str]] = set()  # (part, exception type) said already
        while not self._stopping:
            time.sleep(FLEET_TICK_S)
            for part in (self._digests_pass, self._find_lost_nodes, self._collector_pass,
                         self._let_go_evicted, self._owners_pass):
                try:
                    part()
                except Exception as exc:  # a bug of ours must not end the collection
                    key = (part.__name__, type(exc).__name__)
                    if key not in failed and len(failed) < 64:
                        failed.add(key)
                        self.say(f"the collector's diagnosis failed ({_PARTS[key[0]]}): "
                                 f"{exc!r}; it goes on (said once)")

    def _owners_pass(self) -> None:
        """Ranks set aside, moved from one node to another, or sent by two (claims.py):
        a line each, said once; the conflicts also as findings."""
        for line in self.mirror.news():
            self.say(line)

    def _let_go_evicted(self) -> None:
        """Nodes whose holdings went to make room for another's in a collector-wide cap
        (shares.py): dropped on the loop, one line each, unless a frame of theirs has
        been refused for it already."""
        if self.mirror.evicted:
            self._serving.loop.call_soon_threadsafe(self._drop_evicted)

    def _drop_evicted(self) -> None:
        serving, evicted = self._serving, self.mirror.evicted
        for host in list(evicted):
            why = evicted.pop(host, None)
            links = [link for link in serving.hosts.get(host, ()) if link.state == "node"]
            for link in links:
                serving.drop(link, f"dropped {link.who}: {why}", "dropped", why)
            if why is not None and not links:
                self.say(f"node {host}: {why}")

    def _digests_pass(self) -> None:
        fleet = self.mirror.fleet
        if fleet.digests:
            fleet.tick()
        version = fleet.version
        if version != self._written:
            self.mirror.set_findings("(digests)", fleet.findings())
            self._written = version  # (only once written: a failed write is tried again)

    def _collector_pass(self) -> None:
        ours = (self.mirror.links.findings({**self.mirror.host_of(),
                                            **self.mirror.fleet.host_of()})
                + list(self._lost.values()))
        now = [f.to_json() for f in ours]
        if now != self._said:  # new, or a slow link's newest numbers
            self.mirror.set_findings("(collector)", ours)
            self._said = now

    def _silent(self) -> dict[str, tuple[float, bool]]:
        """Nodes that sent nothing for LOST_S and whose job has not ended: host ->
        (seconds, whether their stream ended)."""
        from distdoctor.collect.lost import LOST_S

        now = time.monotonic()
        with self._lock:
            streams = list(self.streams.values())
        return {n.host: (now - n.last_frame_s, n.closed) for n in streams
                if not n.ended and now - n.last_frame_s >= LOST_S}

    def _find_lost_nodes(self) -> None:
        from distdoctor.collect import lost
        from distdoctor.diagnosis.hangs.progress import STALL_S

        silent = {h: v for h, v in self._silent().items() if h not in self._lost}
        now = time.monotonic()
        if not silent or now - self._lost_checked_s < LOST_CHECK_S:
            return
        self._lost_checked_s = now  # (reads every rank's log tail: not every tick)
        positions = lost.copy_positions(self.mirror.run_dir, self.mirror.newest_logs())
        positions.update(self.mirror.fleet.lost_positions())  # nodes that send digests
        wait_s = self.hang_timeout_s if self.hang_timeout_s is not None else STALL_S
        for f in lost.lost_node_findings(silent, positions, wait_s):
            self._lost[f.details["host"]] = f

    def stop(self) -> None:
        """Every connection closed (the nodes back off and reconnect to the next
        collector), the copy's files closed."""
        self._stopping = True
        if self._thread.ident is None:  # never started: nothing runs the loop
            self._serving.listener.close()
        else:
            self._serving.stop()
            self._thread.join(timeout=5)
        self.mirror.close()
