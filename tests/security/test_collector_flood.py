"""Floods from many addresses against a real collector with a token (`distdoctor watch
--listen`, DISTDOCTOR_TOKEN set) over loopback only, from 127.0.0.x source addresses:
what a defence keyed on one address does not see. Bounded in connections and time; each
case failed on the code before its fix.
"""

from __future__ import annotations

import json
import socket
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from simnode import (  # noqa: E402
    CollectorProcess,
    HelloFlood,
    connect_node,
    hello,
    joins_answering_late,
    reply,
)

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


@pytest.mark.timeout(90)
def test_a_hello_flood_from_many_addresses_does_not_keep_a_node_out(collector):
    """300 connections at a time from 250 addresses, each saying HELLO and never
    answering: the budget of 64 dropped its oldest, the real node answering its
    challenge 50 ms away; a rule per address sees one connection each. A connection has
    its own time to answer now, and the flood waits its turn in the backlog: the node
    gets in 5 times of 5, each within a few seconds."""
    waits = []
    with HelloFlood(collector.address, n=300, sources=250) as flood:
        for _ in range(5):
            start = time.monotonic()
            ok = joins_answering_late(collector.address, TOKEN, delay_s=0.05)
            waits.append(round(time.monotonic() - start, 2) if ok else None)
    assert None not in waits and max(waits) < 8, (waits, flood.opened)
    assert flood.opened > 400, flood.opened  # the flood was at work
    assert collector.proc.poll() is None and "Traceback" not in collector.text()


def _guess(address, source: str) -> str:
    """One wrong answer from `source`: the collector's refusal, up to its first colon."""
    with socket.create_connection(address, timeout=5, source_address=(source, 0)) as s:
        s.sendall(hello("guesser"))
        got = reply(s)
        if got is None or got[0] != wire.CHALLENGE:
            return "no challenge"
        s.sendall(wire.json_frame(wire.AUTH, {"answer": "00" * 32}))
        got = reply(s)
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
                s.sendall(hello("newcomer"))
                got = reply(s)
                s.sendall(wire.json_frame(wire.AUTH, {
                    "answer": auth.answer(TOKEN, got[3], "newcomer")}))
                got_in = (reply(s) or (0,))[0] == wire.WELCOME
        except OSError:
            pass
        if not got_in:
            time.sleep(0.5)
    assert got_in, collector.text()[-2000:]
    assert collector.proc.poll() is None and "Traceback" not in collector.text()
