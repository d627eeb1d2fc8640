"""The collector: accepts the nodes' forwarding streams and keeps their copy (mirror.py).

One thread per node (a job has tens to hundreds of nodes; each sends a few hundred KiB/s
at most), and one for what only the collector sees: the digests' findings, slow links
between nodes (links.py) and nodes lost while the others wait for them (lost.py).
A node must say HELLO first, with the token when the collector has one; a node that sends
a malformed frame, a wrong token, or nothing for IDLE_S is dropped with one line, and what
it sent before stays.
"""

from __future__ import annotations

import hmac
import ipaddress
import socket
import ssl
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from distdoctor.collect import tls, wire
from distdoctor.collect.mirror import Mirror, NodeMirror
from distdoctor.errors import UserError

IDLE_S = 60.0  # a node sends its logs' state 4 times a second: this much silence is loss
HELLO_S = 10.0  # from connecting to a whole HELLO: a peer that dribbles is dropped
MAX_CONNECTIONS = 1024
FLEET_TICK_S = 0.5
LOST_CHECK_S = 1.0  # while a node is silent: how often the others' positions are read


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
    DISTDOCTOR_TLS_*) it is a TLS listener: each node's handshake is done on its own
    thread, and a node that does not speak TLS gets nothing in."""
    settings = tls.settings() if settings is None else settings
    ctx = settings.server_context(what)
    try:
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        sock = socket.create_server(address, family=family)
    except OSError as exc:
        raise UserError(f"{what}: cannot listen on {address[0]}:{address[1]}: "
                        f"{exc.strerror or exc}") from None
    if ctx is None:
        if not is_loopback(address[0]):
            print(f"distdoctor: {what}: no TLS on {address[0]}: the token and the nodes' "
                  f"data travel in clear (set {tls.CERT} and {tls.KEY})", file=sys.stderr)
        return sock
    return ctx.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)


class Collector:
    def __init__(self, run_dir: str | Path, listener: socket.socket, token: str | None,
                 say: Callable[[str], None], on_finding: Callable | None = None,
                 hang_timeout_s: float | None = None):
        """`say`: one line of news (a node came, went, was refused); `on_finding`: each
        finding a node forwards (the errors in its job's output)."""
        self.mirror = Mirror(run_dir, on_finding, hang_timeout_s)
        self.token = token
        self.say = say
        self.nodes: dict[str, int] = {}  # host -> connections so far
        self.streams: dict[str, NodeMirror] = {}  # host -> its newest connection
        self.hang_timeout_s = hang_timeout_s
        self._lost: dict[str, object] = {}  # host -> its lost-node finding (kept)
        self._lost_checked_s = 0.0
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._refused: set[tuple[str, str]] = set()  # (peer address, why) said once
        self._stopping = False
        self._listener = listener
        self.address = listener.getsockname()[:2]
        self._thread = threading.Thread(target=self._accept, name="distdoctor-collector",
                                        daemon=True)
        self._fleet_thread = threading.Thread(target=self._diagnose, daemon=True,
                                              name="distdoctor-fleet")

    def start(self) -> Collector:
        self._thread.start()
        self._fleet_thread.start()
        return self

    def _diagnose(self) -> None:
        """What only the collector sees, into the copy's findings.json (and printed, by a
        service) as it appears: the findings over the digests' ranks, slow links between
        nodes (links.py), nodes lost while the others wait for them (lost.py)."""
        from distdoctor.priority import lower_this_thread

        lower_this_thread()
        fleet, links = self.mirror.fleet, self.mirror.links
        written, said = 0, []
        while not self._stopping:
            time.sleep(FLEET_TICK_S)
            try:
                if fleet.digests:
                    fleet.tick()
                if fleet.version != written:
                    written = fleet.version
                    self.mirror.set_findings("(digests)", fleet.findings())
                self._find_lost_nodes()
                ours = (links.findings({**self.mirror.host_of(), **fleet.host_of()})
                        + list(self._lost.values()))
                now = [f.to_json() for f in ours]
                if now != said:  # new, or a slow link's newest numbers
                    said = now
                    self.mirror.set_findings("(collector)", ours)
            except Exception as exc:  # a bug of ours must not end the collection
                self.say(f"the collector's diagnosis stopped: {exc!r}")
                return

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
        from distdoctor.diagnosis.progress import STALL_S

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
        self._stopping = True
        try:
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept (close alone won't)
        except OSError:
            pass
        self._listener.close()
        self._thread.join(timeout=5)
        with self._lock:
            for conn in self._conns:
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        self.mirror.close()

    def _accept(self) -> None:
        while not self._stopping:
            try:
                conn, peer = self._listener.accept()
            except OSError:
                return  # closed by stop()
            if self._stopping:
                conn.close()
                return
            with self._lock:
                full = len(self._conns) >= MAX_CONNECTIONS
                if not full:
                    self._conns.add(conn)
            if full:
                conn.close()
                self.say(f"refused {peer[0]}:{peer[1]}: {MAX_CONNECTIONS} nodes connected")
                continue
            try:
                threading.Thread(target=self._serve, args=(conn, peer), daemon=True,
                                 name=f"distdoctor-node-{peer[0]}").start()
            except RuntimeError as exc:  # no thread to be had: this node waits, not all
                with self._lock:
                    self._conns.discard(conn)
                conn.close()
                self.say(f"refused {peer[0]}:{peer[1]}: {exc}")

    def _serve(self, conn: socket.socket, peer) -> None:
        who = f"{peer[0]}:{peer[1]}"
        node = None
        try:
            if isinstance(conn, ssl.SSLSocket):
                try:
                    tls.handshake(conn)
                except (ssl.SSLError, OSError) as exc:  # a plaintext node, a wrong CA
                    if not self._stopping:
                        self._say_refused(peer, who, tls.failure(exc))
                    return
            hello = self._hello(conn)
            if hello is None:
                return
            if self.token is not None and not hmac.compare_digest(
                    str(hello.get("token") or "").encode(), self.token.encode()):
                self._refuse(conn, peer, "wrong or missing token (DISTDOCTOR_TOKEN)")
                return
            node = NodeMirror(self.mirror, hello)
            conn.sendall(wire.frame(wire.WELCOME))
            who = f"node {node.host} ({who})"
            with self._lock:
                self.nodes[node.host] = self.nodes.get(node.host, 0) + 1
                self.streams[node.host] = node
            self.say(f"{who} connected")
            conn.settimeout(IDLE_S)
            reader = conn.makefile("rb")
            while (got := wire.read_frame(reader.read)) is not None:
                node.apply(*got)
            if node.ended:
                self.say(f"{who} finished")
            else:  # closed between frames, without its exit codes: its `run` died
                self.say(f"lost {who}: its stream ended before the job's exit codes (its "
                         f"`distdoctor run` was killed?); its ranks are taken for gone")
                self.mirror.lost_node(node)
        except wire.WireError as exc:
            if node is None:  # before WELCOME: the node is told why, and backs off
                self._refuse(conn, peer, str(exc))
            else:
                self.say(f"dropped {who}: {exc}")
        except OSError as exc:
            if not self._stopping:
                self.say(f"lost {who}: {exc.strerror or exc}")
        except Exception as exc:  # a bug of ours: one node's stream, not the collector
            if not self._stopping:
                self.say(f"dropped {who}: {exc!r}")
        finally:
            if node is not None:
                node.close()
            with self._lock:
                self._conns.discard(conn)
            conn.close()

    @staticmethod
    def _hello(conn: socket.socket) -> dict | None:
        """The first frame, whole within HELLO_S (read byte counts, not a timeout per
        read: a peer that dribbles a byte at a time is dropped too)."""
        deadline = time.monotonic() + HELLO_S

        def recv_exactly(n: int) -> bytes:
            data = b""
            while len(data) < n:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise wire.WireError(f"no HELLO within {HELLO_S:g} s")
                conn.settimeout(left)
                chunk = conn.recv(n - len(data))
                if not chunk:
                    break
                data += chunk
            return data

        try:
            first = wire.read_frame(recv_exactly, max_payload=wire.MAX_HELLO)
        except TimeoutError:
            raise wire.WireError(f"no HELLO within {HELLO_S:g} s") from None
        if first is None:
            return None
        if first[0] != wire.HELLO:
            raise wire.WireError("the first frame is not HELLO")
        hello = wire.json_payload(wire.HELLO, first[3])
        if hello.get("format") != wire.FORMAT:
            raise wire.WireError("HELLO is not a distdoctor forwarder's")
        return hello

    def _say_refused(self, peer, who: str, why: str) -> None:
        """One line per peer address and reason: a refused node asks again every 30 s."""
        with self._lock:
            new = (peer[0], why) not in self._refused
            self._refused.add((peer[0], why))
        if new:
            self.say(f"refused {who}: {why}")

    def _refuse(self, conn: socket.socket, peer, why: str) -> None:
        self._say_refused(peer, f"{peer[0]}:{peer[1]}", why)
        try:
            conn.sendall(wire.json_frame(wire.REFUSED, {"why": why}))
        except OSError:
            pass
