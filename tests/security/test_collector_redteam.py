"""The rebuilt collector (issue 46) attacked again from outside, over loopback only: what
the first round of defences still let through. Each case is a real `distdoctor watch
--listen` process and real sockets, bounded in count and time; each failed on the code
before its fix.
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
    dropped,
    hello,
    joins_answering_late,
    meta,
    reply,
    send,
)

from distdoctor.collect import wire  # noqa: E402

TOKEN = "tok-redteam-51d2"


@pytest.fixture
def with_token(monkeypatch):
    monkeypatch.setenv("DISTDOCTOR_TOKEN", TOKEN)


def _collector(tmp_path: Path) -> CollectorProcess:
    return CollectorProcess(tmp_path / "copy", tmp_path / "collector.txt").started()


@pytest.mark.timeout(30)
def test_challenges_taken_at_once_do_not_each_buy_a_guess(tmp_path, with_token):
    """40 connections say HELLO before any answer is judged, then all answer wrong: the
    throttle is asked when an answer comes, not only at HELLO (else 40 guesses at once,
    and again each time the lockout ends)."""
    c = _collector(tmp_path)
    socks = []
    try:
        for _ in range(40):
            s = socket.create_connection(c.address, timeout=5)
            s.sendall(hello("guesser", instance="i"))
            socks.append(s)
        assert all(reply(s)[0] == wire.CHALLENGE for s in socks)
        for s in socks:
            s.sendall(wire.json_frame(wire.AUTH, {"answer": "00" * 32}))
        whys = Counter(json.loads(reply(s)[3])["why"].split(" (")[0][:20]
                       for s in socks)
        judged = whys["wrong or missing tok"]
        assert judged <= 4, whys  # FREE_WRONG, and one more that starts the lockout
        assert c.proc.poll() is None
    finally:
        for s in socks:
            s.close()
        c.stop()


@pytest.mark.timeout(30)
def test_deeply_nested_hello_is_a_summed_refusal(tmp_path, with_token):
    """A HELLO of 60,000 '[' (json's RecursionError) from 50 connections: refused like
    any malformed frame, summed per address, never a line per connection."""
    c = _collector(tmp_path)
    try:
        before = len(c.text().splitlines())
        for _ in range(50):
            with socket.create_connection(c.address, timeout=5) as s:
                s.sendall(wire.frame(wire.HELLO, b"[" * 60_000))
                dropped(s, 5)
        time.sleep(0.5)
        lines = c.text().splitlines()[before:]
        assert len(lines) <= 3, lines[:5]
        assert "RecursionError" not in c.text()
        connect_node(c.address, "real", TOKEN).close()  # and a node still gets in
    finally:
        c.stop()


_ROW = '[1,"collective","all_reduce","ok","g",0,null,[[4]],["float32"],4,4,"sum",null,1,2,null]'


def _victim_applied_within(c: CollectorProcess, victim: socket.socket, timeout_s: float) -> bool:
    """Whether the collector writes a SAMPLES frame of `victim` (node "victim") within
    `timeout_s`: its loop is not stalled by another node."""
    send(victim, wire.frame(wire.SAMPLES, b'{"t": 1}\n'))
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any((c.out_path.parent / "copy").rglob("*victim*")):
            return True
        time.sleep(0.05)
    return False


@pytest.mark.timeout(40)
@pytest.mark.parametrize("ranks, count", [("[]", 65536), ("[0]", -(10 ** 9))])
def test_a_digest_of_rankless_runs_does_not_stall_the_loop(tmp_path, ranks, count):
    """A 400-byte DIGEST whose runs name no rank (each counted as 0 arrivals), or whose
    first run has a negative count (the sum of the others hides under the bound), took
    the loop for 80 s: every node deaf. Counted by the work they cost, they are refused
    and the other node's frames go on."""
    c = _collector(tmp_path)
    try:
        victim, evil = connect_node(c.address, "victim"), connect_node(c.address, "evil")
        runs = [f'["g",{i * 65536},0,{ranks},{count}]' for i in range(1)]
        runs += [f'["g",{i * 65536},0,[],65536]' for i in range(1, 10)]
        text = json.dumps({"host": "evil", "ranks": [], "groups": {"g": ["d", [0, 1]]},
                           "sigs": {"0": json.loads(_ROW)},
                           "arrivals": [json.loads(r) for r in runs], "waits": [],
                           "dropped": 0})
        send(evil, meta(0, "evil"), wire.frame(wire.DIGEST, text.encode()))
        time.sleep(0.05)
        assert _victim_applied_within(c, victim, 5), "the loop stalled"
        assert dropped(evil, 5)
        assert "arrival" in c.text(), c.text()
    finally:
        c.stop()


@pytest.mark.timeout(60)
def test_findings_of_many_host_names_stay_bounded(tmp_path):
    """Nodes that each send ~0.9 MB of findings under a new host name: findings.json is
    written whole on every FINDINGS frame, on the loop, so without a bound over all nodes
    each frame costs more (30 names: 10 s a frame, 290 MiB). Past the bound a node is
    refused with a line; the file stays small and another node's frames go on."""
    c = _collector(tmp_path)
    details = {f"k{i}": "x" for i in range(600)}
    try:
        victim = connect_node(c.address, "victim")
        for h in range(12):
            node = connect_node(c.address, f"chatty{h}")
            findings = [{"kind": "crash", "severity": "error", "summary": f"s{j}",
                         "ranks": [0], "details": dict(details, source="log")}
                        for j in range(100)]
            send(node, wire.json_frame(wire.FINDINGS, {"findings": findings}))
            dropped(node, 0.3)
            node.close()
        assert _victim_applied_within(c, victim, 10), "the loop stalled"
        size = (tmp_path / "copy" / "findings.json").stat().st_size
        assert size < 16 << 20, size
        assert "bytes of the nodes' findings already" in c.text(), c.text()[-2000:]
    finally:
        c.stop()


@pytest.mark.timeout(30)
def test_bidi_controls_from_a_node_are_not_printed(tmp_path):
    """A finding's summary with U+202E (right-to-left override) and an isolate: printed
    raw, the terminal shows the text reversed ("Trojan Source"), so what the operator
    reads is not what the node said; they are controls, shown as '?' like the others."""
    c = _collector(tmp_path)
    try:
        node = connect_node(c.address, "bidi")
        summary = "rank 3 died \u202egnp.exe\u202c \u2067x\u2069 \u061c\u200f"
        send(node, wire.json_frame(wire.FINDINGS, {"findings": [
            {"kind": "crash", "severity": "error", "summary": summary, "ranks": [0],
             "details": {"source": "log"}}]}))
        text = c.wait_for("rank 3 died", 10)
        assert not any(ch in text for ch in "\u202e\u202c\u2067\u2069\u061c\u200f"), text
        node.close()
    finally:
        c.stop()


@pytest.mark.timeout(40)
def test_a_speaking_flood_from_one_address_does_not_keep_a_node_out(tmp_path, with_token):
    """150 connections from one address that each say HELLO (so none is idle): the
    budget of 64 was given to the oldest, whoever held it; a node 50 ms away never got
    to answer its challenge. The flood's own connections go first now."""
    c = _collector(tmp_path)
    try:
        with HelloFlood(c.address, n=150, budget=15_000) as flood:
            welcomed = [joins_answering_late(c.address, TOKEN, 0.05, source="127.0.0.2")
                        for _ in range(5)]
        assert welcomed == [True] * 5, (welcomed, flood.opened)
        assert flood.opened > 200  # the flood was at work
        assert c.proc.poll() is None
    finally:
        c.stop()
