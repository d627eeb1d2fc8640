"""The collector's connections, all on one asyncio event loop (one thread, whatever the
number of nodes): accepting, the budget of connections that have not authenticated yet,
HELLO and the token's challenge (auth.py), then each node's frames into the copy.

Bounded like OpenSSH's MaxStartups and LoginGraceTime: at most MAX_PENDING connections
wait to authenticate, and each for AUTH_S at most. When one more comes and none is free,
one goes: the oldest that has not sent a byte (a flood of idle sockets cannot keep a node
out: a node's HELLO comes with its connection), else one chosen at random among those
silent past ANSWER_S since they were last asked (HELLO sent, the challenge unanswered:
random early drop, which a flood cannot aim), and while a connection is within its
ANSWER_S it keeps its place, so a real node answering its challenge a network away is
never the one dropped. When none may go, the newcomer waits in the kernel's backlog
(first come, first served) until one may: a flood from any number of addresses delays a
node by the time the flood ahead of it takes to go through, never keeps it out.
Authenticated nodes have their own cap, MAX_NODES. An accept that fails (out of file
descriptors, or anything else) is said once, with the limit and the remedy, and the
listener goes on.
Refusals are summed per peer address (refusals.py). Frames are applied to the copy on
the loop itself: they are written into mmapped files, a few microseconds each.
"""

from __future__ import annotations

import asyncio
import errno
import os
import random
import socket
import ssl
import time
from collections import OrderedDict

from distdoctor.collect import auth, shares, tls, wire
from distdoctor.collect.descriptors import AcceptTrouble, open_files_limit
from distdoctor.collect.link import Link
from distdoctor.collect.mirror import HOST_NAME, NodeMirror
from distdoctor.collect.refusals import NodeNews, Refusals

AUTH_S = 5.0  # from accept to WELCOME: the TLS handshake, HELLO and the answer
ANSWER_S = 0.5  # a pending connection's own time to say HELLO, or to answer its challenge
IDLE_S = 60.0  # a node sends its logs' state 4 times a second: this much silence is loss
MAX_PENDING = 64
MAX_NODES = 1024
ACCEPT_BATCH = 16  # accepts per turn of the loop: the nodes' frames are read between
SWEEP_S = 1.0
CLOSE_GRACE_S = 1.0  # a refused peer has this long to read why, then it is cut
THROTTLED = "too many wrong answers from this address: it waits before it may try again"
GUESSING = ("too many wrong answers from many addresses of late: an answer from an address "
            "no node got in from is judged once they stop (try again later)")
FREED = "dropped to free a file descriptor for a new connection"
FULL = (f"{MAX_PENDING} connections were waiting to authenticate: an idle one went, or "
        f"one silent past its {ANSWER_S:g} s to answer, at random")
# Descriptors never given to connections: the copy's files, the viewer's reads, /metrics
# (the rest of the open-files limit is the connections' room, pending and nodes)
RESERVE_FILES = 32
WRONG = "wrong or missing token (DISTDOCTOR_TOKEN): the answer to the challenge is wrong"


class Serving:
    """The loop's side of the Collector: every connection, pending or a node."""

    def __init__(self, collector, listener: socket.socket, context: ssl.SSLContext | None,
                 token: str | None):
        """`collector`: the server.Collector whose mirror, say, nodes, streams, _conns
        and _lock this keeps (it owns the thread this loop runs on)."""
        self.collector, self.listener, self.context = collector, listener, context
        self.token = token
        self.mirror = collector.mirror
        self.say = collector.say
        self.client_certs = context is not None and context.verify_mode == ssl.CERT_REQUIRED
        self.pending: OrderedDict[Link, None] = OrderedDict()  # oldest first
        self.nodes: set[Link] = set()
        self.hosts: dict[str, list[Link]] = {}  # host -> its live connections
        self.wrong = auth.WrongAnswers()
        self.refusals = Refusals(self.say)
        self.news = NodeNews(self.say)
        self.trouble = AcceptTrouble(self.say, MAX_PENDING)
        self.room = MAX_NODES + MAX_PENDING  # (set from the open-files limit in run())
        self.loop = asyncio.new_event_loop()
        listener.setblocking(False)

    # --- the loop's life --------------------------------------------------------------------
    def run(self) -> None:
        """The collector's thread: the loop, until stop()."""
        loop = self.loop
        asyncio.set_event_loop(loop)
        self.room = connections_room()
        loop.add_reader(self.listener.fileno(), self._accept)
        loop.call_later(SWEEP_S, self._sweep)
        try:
            loop.run_forever()
            tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for task in tasks:
                task.cancel()
            if tasks:
                loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        finally:
            loop.close()

    def stop(self) -> None:
        """From any thread: every connection cut (quietly: the collector stops, not the
        nodes), and the loop ends."""
        try:
            self.loop.call_soon_threadsafe(self._stop)
        except RuntimeError:  # the loop is closed already
            pass

    def _stop(self) -> None:
        self._stop_accepting()
        for link in [*self.pending, *self.nodes]:
            link.quiet = True
            self._cut(link)
        self.loop.call_soon(self.loop.stop)  # after the cuts' callbacks

    def _stop_accepting(self) -> None:
        try:
            self.loop.remove_reader(self.listener.fileno())
        except (ValueError, OSError):
            pass
        self.listener.close()

    # --- accepting --------------------------------------------------------------------------
    def _accept(self) -> None:
        for _ in range(ACCEPT_BATCH):
            if len(self.pending) + len(self.nodes) >= self.room:
                freed = self._make_room(FREED)
                self.trouble.failed(OSError(errno.EMFILE, os.strerror(errno.EMFILE)),
                                    freed, self.room)
                if not freed:  # the room is the nodes' and the handshakes': the next
                    return self._pause_accepting()  # waits in the kernel's backlog
            if len(self.pending) >= MAX_PENDING and not self._make_room(FULL):
                return self._pause_accepting(self._next_turn_s())
            try:
                sock, peer = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                return self._cannot_accept(exc)
            self.trouble.accepted()
            self._admit(sock, peer)

    def _cannot_accept(self, exc: OSError) -> None:
        out_of_files = exc.errno in (errno.EMFILE, errno.ENFILE)
        freed = out_of_files and self._make_room(FREED)
        self.trouble.failed(exc, freed)
        if not freed:  # (a freed descriptor is closed before the loop's next turn)
            self._pause_accepting()

    def _pause_accepting(self, wait_s: float | None = None) -> None:
        fd = self.listener.fileno()
        self.loop.remove_reader(fd)
        self.loop.call_later(self.trouble.retry_s() if wait_s is None else wait_s,
                             self._resume_accepting, fd)

    def _resume_accepting(self, fd: int) -> None:
        if self.listener.fileno() == fd:  # (not stopped meanwhile)
            self.loop.add_reader(fd, self._accept)

    def _admit(self, sock: socket.socket, peer) -> None:
        sock.setblocking(False)
        link = Link(self, sock, peer)
        try:  # a node sends HELLO (or its TLS hello) as it connects: often here already
            link.spoke = bool(sock.recv(1, socket.MSG_PEEK))
        except OSError:
            pass
        self.pending[link] = None
        with self.collector._lock:
            self.collector._conns.add(sock)
        link.deadline = self.loop.call_later(AUTH_S, self._expire, link)
        link.task = self.loop.create_task(self._open(link))

    async def _open(self, link: Link) -> None:
        link.opening = True
        try:
            await self.loop.connect_accepted_socket(lambda: link, link.sock, ssl=self.context)
        except asyncio.CancelledError:  # cut while its TLS handshake went on
            self.gone(link, None)
            raise
        except (ssl.SSLError, OSError) as exc:  # a plaintext peer, a wrong CA, a reset
            if link.state != "closed":
                link.state = "closed"
                self.refusals.refused(link.address, link.port, tls.failure(exc))
            self.gone(link, exc)

    def _make_room(self, why: str) -> bool:
        """One pending connection less (said, summed, as refused for `why`): one refused
        already, else the oldest that has not sent a byte (the newest idle one may be a
        node whose HELLO is on its way), else one chosen at random among those silent
        past their ANSWER_S. False when none may go."""
        link = next((p for p in self.pending if p.state == "closed"), None)
        if link is None:
            link = next((p for p in self.pending if not p.spoke), None)
            if link is None:
                now = time.monotonic()
                silent = [p for p in self.pending if now - p.asked_s >= ANSWER_S]
                if not silent:
                    return False
                link = random.choice(silent)
            self.refusals.refused(link.address, None, why)
            link.state = "closed"
        link.quiet = True
        self._cut(link)
        self.pending.pop(link, None)  # its descriptor is free by the loop's next turn
        return True

    def _next_turn_s(self) -> float:
        """How long until the first pending connection's ANSWER_S ends (a moment at least)."""
        first = min((p.asked_s for p in self.pending), default=time.monotonic())
        return max(0.01, first + ANSWER_S - time.monotonic())

    def _expire(self, link: Link) -> None:
        if link.state in ("closed", "node"):
            return
        why = (f"no TLS handshake within {AUTH_S:g} s" if link.transport is None
               and self.context is not None else
               f"no HELLO within {AUTH_S:g} s" if link.state == "hello" else
               f"no answer to the challenge within {AUTH_S:g} s")
        self.refusals.refused(link.address, link.port, why)
        link.state = "closed"
        self._cut(link)

    def _cut(self, link: Link) -> None:
        """Closed now, whatever it was doing (its descriptor is free by the loop's next
        turn)."""
        if link.transport is not None:
            link.transport.abort()
        elif link.opening and link.task is not None:
            link.task.cancel()  # asyncio closes the half-made transport
        else:
            if link.task is not None:
                link.task.cancel()  # never started: the socket is ours to close
            link.sock.close()
            self.gone(link, None)

    # --- what the peers send ----------------------------------------------------------------
    def frame(self, link: Link, header: wire.Header, payload: bytes) -> None:
        if link.state == "node":
            if header.kind in (wire.CHALLENGE, wire.AUTH, wire.WELCOME, wire.REFUSED):
                raise wire.WireError(f"a {wire.NAMES[header.kind]} frame from a node")
            return link.node.apply(header.kind, header.rank, header.arg, payload, header.log)
        if link.state == "hello":
            return self._hello(link, header, payload)
        if header.kind != wire.AUTH:
            raise wire.WireError(f"expected AUTH, got {wire.NAMES[header.kind]}")
        given = wire.json_payload(wire.AUTH, payload).get("answer")
        if self.wrong.wait_s(link.address) > 0:  # asked again here: challenges taken at
            return self.refuse(link, THROTTLED)  # once must not each buy a guess
        if not self.wrong.may_judge(link.address):  # guesses from many addresses
            return self.refuse(link, GUESSING)
        if not auth.is_right(self.token, link.nonce, link.hello["host"], given):
            self.wrong.wrong(link.address)
            return self.refuse(link, WRONG)
        self.wrong.right(link.address)
        self._welcome(link)

    def _hello(self, link: Link, header: wire.Header, payload: bytes) -> None:
        if header.kind != wire.HELLO:
            raise wire.WireError("the first frame is not HELLO")
        if header.version < wire.VERSION:  # told in its own version, which it can read
            return self.refuse(link, f"this node speaks forwarding protocol {header.version} "
                               f"(it sends its token in clear); the collector speaks "
                               f"{wire.VERSION}: upgrade the node", header.version)
        hello = wire.json_payload(wire.HELLO, payload)
        if hello.get("format") != wire.FORMAT:
            raise wire.WireError("HELLO is not a distdoctor forwarder's")
        host = hello.get("host")
        if not isinstance(host, str) or not HOST_NAME.match(host):
            raise wire.WireError(f"HELLO names no usable host ({str(host)[:60]!r})")
        link.hello = hello
        if self.client_certs:
            names = auth.certificate_names(link.transport.get_extra_info("peercert"))
            if not auth.host_matches(host, names):
                return self.refuse(link, f"HELLO names host {host!r} but its client "
                                   f"certificate names {', '.join(names[:4]) or 'no host'}")
        if self.token is None:
            return self._welcome(link)
        if self.wrong.wait_s(link.address) > 0:
            return self.refuse(link, THROTTLED)
        link.nonce = auth.new_nonce()
        link.state = "auth"
        link.asked_s = time.monotonic()  # its ANSWER_S to answer starts now
        link.send(wire.frame(wire.CHALLENGE, link.nonce))

    def _welcome(self, link: Link) -> None:
        if self.client_certs:  # its certificate's name, as DNS compares it (NODE7, node7.)
            link.hello = {**link.hello, "host": auth.canonical_host(link.hello["host"])}
        host = link.hello["host"]
        live = [other for other in self.hosts.get(host, ()) if other.state == "node"]
        instance = link.hello.get("instance")
        # the same forwarder again, from any address (a NAT's new mapping, a second NIC):
        # its old connection is dead, though no reset came; refused, it was kept out 60 s
        again = [o for o in live if instance is not None and o.hello.get("instance") == instance]
        elsewhere = [o for o in live if o.address != link.address and o not in again]
        if elsewhere:
            return self.refuse(link, f"host {host!r} is already connected from "
                               f"{elsewhere[0].address} (another node by that name?)")
        if len(self.nodes) >= MAX_NODES and not shares.node_room(self, link, host):
            return self.refuse(link, f"{MAX_NODES} nodes connected already")
        for old in again:
            self.drop(old, f"{old.who}: replaced by its new connection", "replaced")
        link.node = NodeMirror(self.mirror, link.hello)
        link.state = "node"
        link.send(wire.json_frame(wire.WELCOME, {"sources": 1}))  # SOURCE frames welcome
        if link.deadline is not None:
            link.deadline.cancel()
        self.pending.pop(link, None)
        self.nodes.add(link)
        self.hosts.setdefault(host, []).append(link)
        self.collector.connected(link.node)
        self.news.news(host, "connected", f"{link.who} connected")

    def refuse(self, link: Link, why: str, version: int = wire.VERSION) -> None:
        """Told why (it backs off and says so on its side), summed here, then cut."""
        self.refusals.refused(link.address, link.port, why)
        link.send(wire.json_frame(wire.REFUSED, {"why": why}, version=version))
        link.state = "closed"
        if link.transport is not None:
            link.transport.close()  # after what is written
            self.loop.call_later(CLOSE_GRACE_S, link.transport.abort)

    def bad_frame(self, link: Link, why: str) -> None:
        if link.state == "node":  # a node's malformed frame: its line (summed: NodeNews)
            self.drop(link, f"dropped {link.who}: {why}", "dropped", why)
        elif link.state != "closed":  # before WELCOME: the node is told why
            self.refuse(link, why)

    def drop(self, link: Link, line: str, kind: str = "lost", reason: str = "") -> None:
        """`line` said (summed per node: NodeNews, by `kind` and `reason`), then cut."""
        if link.state == "closed" and link.quiet:
            return
        if link.node is not None:
            self.news.news(link.node.host, kind, line, reason or line.split(": ", 1)[-1])
        else:
            self.say(line)
        link.quiet = True
        link.state = "closed"
        self._cut(link)

    # --- endings ----------------------------------------------------------------------------
    def gone(self, link: Link, exc) -> None:
        """The connection ended (said once, whoever ended it)."""
        if link.deadline is not None:
            link.deadline.cancel()
        self.pending.pop(link, None)
        with self.collector._lock:
            self.collector._conns.discard(link.sock)
        if link not in self.nodes:
            return
        self.nodes.discard(link)
        peers = self.hosts.get(link.node.host, [])
        if link in peers:
            peers.remove(link)
            if not peers:
                del self.hosts[link.node.host]
                self.collector.left(link.node)
        if not link.quiet:
            self._say_end(link, exc)
        link.quiet = True
        link.node.close()

    def _say_end(self, link: Link, exc) -> None:
        host = link.node.host
        if exc is not None:
            why = str(getattr(exc, "strerror", None) or exc)
            self.news.news(host, "lost", f"lost {link.who}: {why}", why)
        elif link.node.ended:
            self.news.news(host, "finished", f"{link.who} finished")
        else:  # closed between frames, without its exit codes: its `run` died
            self.news.news(host, "lost", f"lost {link.who}: its stream ended before the "
                           f"job's exit codes (its `distdoctor run` was killed?); its ranks "
                           f"are taken for gone", "ended")
            self.mirror.lost_node(link.node)

    def _sweep(self) -> None:
        """Once a second: nodes silent for IDLE_S are cut; the refusals' sums said."""
        now = time.monotonic()
        for link in list(self.nodes):
            if now - link.node.last_frame_s > IDLE_S:
                self.drop(link, f"lost {link.who}: nothing from it for {IDLE_S:g} s")
        self.refusals.flush_if_due()
        self.news.flush_if_due()
        self.trouble.flush_if_due()
        self.loop.call_later(SWEEP_S, self._sweep)


def connections_room() -> int:
    """How many connections (pending and nodes) fit in the open-files limit beside what
    is open now and RESERVE_FILES."""
    soft, _ = open_files_limit()
    if soft < 0:
        return MAX_NODES + MAX_PENDING
    try:
        open_now = len(os.listdir("/proc/self/fd"))
    except OSError:
        open_now = 16
    return max(8, min(MAX_NODES + MAX_PENDING, soft - open_now - RESERVE_FILES))
