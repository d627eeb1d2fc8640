"""One peer's connection to the collector, as its event loop sees it (serving.py): the
bytes it sends cut into frames, each handed to the Serving, which decides what it may do
(HELLO and the challenge while pending, then the frames of a node)."""

from __future__ import annotations

import asyncio
import socket
import time

from distdoctor.collect import wire
from distdoctor.collect.mirror import NodeMirror
from distdoctor.safetext import printable


class Link(asyncio.Protocol):
    """One peer's connection: HELLO (and the challenge) while pending, then its frames."""

    def __init__(self, serving, sock: socket.socket, peer):
        """`serving`: the Serving that owns it (serving.py)."""
        self.serving, self.sock = serving, sock
        self.address, self.port = str(peer[0]), int(peer[1])
        self.transport: asyncio.BaseTransport | None = None
        self.state = "hello"  # -> "auth" -> "node"; "closed" once refused or dropped
        self.spoke = False  # sent a byte (or finished its TLS handshake)
        self.asked_s = time.monotonic()  # when it was last asked to speak (HELLO, AUTH)
        self.opening = False  # its transport is being made (TLS: the handshake)
        self.buf = bytearray()
        self.hello: dict = {}
        self.nonce = b""
        self.node: NodeMirror | None = None
        self.task: asyncio.Task | None = None
        self.deadline: asyncio.TimerHandle | None = None
        self.quiet = False  # its end was said already (or the collector is stopping)

    @property
    def who(self) -> str:
        where = f"{_bracket(self.address)}:{self.port}"
        return f"node {self.node.host} ({where})" if self.node is not None else where

    # --- asyncio.Protocol ------------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport
        if transport.get_extra_info("sslcontext") is not None:
            self.spoke = True  # a TLS handshake is more than an idle socket does
            self.asked_s = time.monotonic()  # and HELLO is due now
        if self.state == "closed":
            transport.abort()

    def data_received(self, data: bytes) -> None:
        self.spoke = True
        if self.state == "closed":
            return
        self.buf += data
        try:
            self._frames()
        except wire.WireError as exc:
            self.serving.bad_frame(self, str(exc))
        except OSError as exc:  # the copy's disk (full, out of descriptors): this node
            self.serving.drop(self, f"lost {self.who}: {exc.strerror or exc}")
        except Exception as exc:  # a bug of ours: one node's stream, never the loop;
            # before WELCOME a refusal (summed per address: a peer that found such a
            # bug must not buy a line per connection)
            self.serving.bad_frame(self, printable(repr(exc), 300))

    def connection_lost(self, exc) -> None:
        self.serving.gone(self, exc)

    # --- frames ----------------------------------------------------------------------------
    def _frames(self) -> None:
        buf, at, size = self.buf, 0, wire.FRAME.size
        try:
            while self.state != "closed" and len(buf) - at >= size:
                limit = wire.MAX_PAYLOAD if self.state == "node" else wire.MAX_HELLO
                header = wire.parse_header(bytes(buf[at:at + size]), limit)
                end = at + size + header.length
                if len(buf) < end:
                    break
                payload = bytes(buf[at + size:end])
                at = end
                self.serving.frame(self, header, payload)
        finally:
            del buf[:at]

    def send(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)


def _bracket(address: str) -> str:
    return f"[{address}]" if ":" in address else address
