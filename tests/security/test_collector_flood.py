"""Floods from many addresses against a real collector with a token (`distdoctor watch
--listen`, DISTDOCTOR_TOKEN set) over loopback only, from 127.0.0.x source addresses:
what a defence keyed on one address does not see. Bounded in connections and time; each
case failed on the code before its fix.
"""

from __future__ import annotations

import json
import select
import socket
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from simnode import CollectorProcess, connect_node  # noqa: E402

from distdoctor.collect import auth, wire  # noqa: E402

TOKEN = "tok-flood-7be3"


@pytest.fixture
def collector(tmp_path, monkeypatch):
    monkeypatch.setenv("DISTDOCTOR_TOKEN", TOKEN)
    c = CollectorProcess(tmp_path / "copy", tmp_path / "collector.txt").started()
    try:
        yield c
    finally:
        c.stop()


def _hello(host: str) -> bytes:
    return wire.json_frame(wire.HELLO, {"format": wire.FORMAT, "version": wire.VERSION,
                                        "host": host, "instance": host, "run": {}})


def _reply(sock: socket.socket):
    try:
        return wire.read_frame(sock.makefile("rb").read, wire.MAX_HELLO)
    except (OSError, wire.WireError):
        return None


class HelloFlood:
    """`n` connections at a time, each from the next of 250 loopback addresses, each
    saying HELLO and then nothing (never idle, never answering its challenge), reopened
    as the collector closes them, in a thread: at most `budget` in all."""

    def __init__(self, address, n: int = 300, budget: int = 20_000):
        self.address, self.n, self.budget, self.opened = address, n, budget, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._keep_up, daemon=True)

    def __enter__(self) -> HelloFlood:
        self._thread.start()
        time.sleep(1.0)  # (the flood at full pressure before the node comes)
        return self

    def _keep_up(self) -> None:
        socks: list[socket.socket] = []
        while not self._stop.is_set() and self.opened < self.budget:
            poller = select.poll()
            for s in socks:
                poller.register(s.fileno(), select.POLLIN)
            gone = {fd for fd, _ in poller.poll(0)}  # (a challenge, or the close)
            for s in [s for s in socks if s.fileno() in gone]:
                try:
                    alive = bool(s.recv(4096, socket.MSG_DONTWAIT))
                except OSError:
                    alive = False
                if not alive:
                    socks.remove(s)
                    s.close()
            while len(socks) < self.n and self.opened < self.budget:
                source = f"127.0.0.{2 + self.opened % 250}"
                try:
                    s = socket.create_connection(self.address, timeout=2,
                                                 source_address=(source, 0))
                    s.sendall(_hello(f"flood{self.opened % 250}"))
                except OSError:
                    break
                socks.append(s)
                self.opened += 1
            time.sleep(0.005)
        for s in socks:
            s.close()

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def _joins_a_network_away(address, delay_s: float = 0.05) -> bool:
    """A new node from 127.0.0.1 that answers its challenge `delay_s` after it came."""
    with socket.create_connection(address, timeout=8) as s:
        s.settimeout(8)
        s.sendall(_hello("real"))
        got = _reply(s)
        if got is not None and got[0] == wire.CHALLENGE:
            time.sleep(delay_s)
            s.sendall(wire.json_frame(wire.AUTH, {"answer": auth.answer(TOKEN, got[3],
                                                                         "real")}))
            got = _reply(s)
        return got is not None and got[0] == wire.WELCOME


@pytest.mark.timeout(90)
def test_a_hello_flood_from_many_addresses_does_not_keep_a_node_out(collector):
    """300 connections at a time from 250 addresses, each saying HELLO and never
    answering: the budget of 64 dropped its oldest, the real node answering its
    challenge 50 ms away; a rule per address sees one connection each. A connection has
    its own time to answer now, and the flood waits its turn in the backlog: the node
    gets in 5 times of 5, each within a few seconds."""
    waits = []
    with HelloFlood(collector.address) as flood:
        for _ in range(5):
            start = time.monotonic()
            ok = _joins_a_network_away(collector.address)
            waits.append(round(time.monotonic() - start, 2) if ok else None)
    assert None not in waits and max(waits) < 8, (waits, flood.opened)
    assert flood.opened > 400, flood.opened  # the flood was at work
    assert collector.proc.poll() is None and "Traceback" not in collector.text()


def _guess(address, source: str) -> str:
    """One wrong answer from `source`: the collector's refusal, up to its first colon."""
    with socket.create_connection(address, timeout=5, source_address=(source, 0)) as s:
        s.sendall(_hello("guesser"))
        got = _reply(s)
        if got is None or got[0] != wire.CHALLENGE:
            return "no challenge"
        s.sendall(wire.json_frame(wire.AUTH, {"answer": "00" * 32}))
        got = _reply(s)
        return json.loads(got[3])["why"].split(":")[0] if got and got[0] == wire.REFUSED else "?"


@pytest.mark.timeout(90)
def test_guesses_from_many_addresses_are_bounded_and_nodes_still_get_in(collector):
    """Each address had its own 2 free guesses: 120 addresses, 240 wrong answers judged
    at once. Over all addresses a few are judged now, the rest refused unjudged; a node
    that got in before from its address is judged at once meanwhile, and a new node gets
    in once the guessing stops."""
    connect_node(collector.address, "known", TOKEN).close()  # from 127.0.0.1, before
    whys = Counter(_guess(collector.address, f"127.0.0.{2 + i % 120}") for i in range(240))
    judged = whys["wrong or missing token (DISTDOCTOR_TOKEN)"]
    assert judged <= 30, whys
    assert whys["too many wrong answers from many addresses of late"] >= 200, whys
    connect_node(collector.address, "known", TOKEN).close()  # at once: no AssertionError
    deadline, got_in = time.monotonic() + 20, False
    while not got_in and time.monotonic() < deadline:  # a new node, retrying
        try:
            with socket.create_connection(collector.address, timeout=5,
                                          source_address=("127.0.0.200", 0)) as s:
                s.sendall(_hello("newcomer"))
                got = _reply(s)
                s.sendall(wire.json_frame(wire.AUTH, {
                    "answer": auth.answer(TOKEN, got[3], "newcomer")}))
                got_in = (_reply(s) or (0,))[0] == wire.WELCOME
        except OSError:
            pass
        if not got_in:
            time.sleep(0.5)
    assert got_in, collector.text()[-2000:]
    assert collector.proc.poll() is None and "Traceback" not in collector.text()
