"""The collector (`distdoctor watch --listen`) against what its earlier attack tests left
out, on loopback only: peers that come and go under names of their own.

Each case runs a real collector (its event loop on its own thread) and real peers over
loopback sockets; every loop is bounded, every socket closed, the collector stopped.
"""

from __future__ import annotations

import gc
import json
import socket
import time
import tracemalloc

import pytest
from simnode import CollectorProcess, connect_node, hello, reply, send, until
from test_collector_poison import _digest, _kinds, _mismatch_between_honest_nodes

from distdoctor.collect import wire
from distdoctor.collect.reports import LATE_MIN_S
from distdoctor.collect.server import Collector, listen


def _comes_and_goes(address, names: range) -> None:
    """A peer that says HELLO under each name in turn, is welcomed and leaves."""
    for i in names:
        with socket.create_connection(address, timeout=10) as s:
            s.sendall(hello(f"cycled-{i:06d}.{'x' * 200}"))
            got = reply(s)
            assert got is not None and got[0] == wire.WELCOME, got


def _settled(collector: Collector, timeout_s: float = 10) -> None:
    """Every connection's end seen by the collector's loop."""
    deadline = time.monotonic() + timeout_s
    while collector._conns and time.monotonic() < deadline:
        time.sleep(0.02)


@pytest.mark.timeout(60)
def test_host_names_cycled_by_a_peer_leave_nothing_held(tmp_path):
    """A peer that connects under a new host name each time, sends no rank and leaves
    (anyone, at a loopback collector without a token; a node whose host name is new at
    each start): every name stayed, its last connection's state held, for the copy's
    life (3,000 names: 3.6 MiB more; a million, gigabytes), and the pass for lost nodes
    read them all. A host gone that owns no rank is now forgotten."""
    lines: list[str] = []
    collector = Collector(tmp_path / "copy", listen(("127.0.0.1", 0)), None,
                          lines.append).start()
    try:
        _comes_and_goes(collector.address, range(200))  # (the loop's own warm-up)
        _settled(collector)
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            _comes_and_goes(collector.address, range(200, 3200))
            _settled(collector)
            gc.collect()
            grown = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        assert grown < 1 << 20, f"3,000 names gone hold {grown / 2**20:.1f} MiB"
    finally:
        collector.stop()


def _late_nodes(c: CollectorProcess, names: list[str]) -> None:
    """Nodes that send a digest, then their next one LATE_MIN_S late and more, and go."""
    socks = [connect_node(c.address, name) for name in names]
    try:
        for sock, name in zip(socks, names, strict=True):
            assert send(sock, _digest(name, []))
        time.sleep(LATE_MIN_S + 0.5)
        for sock, name in zip(socks, names, strict=True):
            assert send(sock, _digest(name, []))
        time.sleep(0.5)  # (read before they go)
    finally:
        for sock in socks:
            sock.close()


@pytest.mark.timeout(60)
def test_thousands_of_late_nodes_leave_the_digests_findings_written(tmp_path):
    """Each node whose digests came late was one `host` finding of its own, kept: past
    ~2,800 of them (1,300 of long names here) the collector's findings of the digests
    passed the 1 MiB findings.json holds for one source, every write of them failed, and
    from then on none was written or said: a mismatch between two honest nodes went
    unsaid. The first 256 late nodes are named, the others counted in one finding."""
    c = CollectorProcess(tmp_path / "copy", tmp_path / "collector.txt").started()
    try:
        for wave in range(2):  # (1,024 nodes connected at most at once)
            _late_nodes(c, [f"late-{wave}-{i:03d}-{'x' * 236}" for i in range(650)])
        honest = _mismatch_between_honest_nodes(c)
        until(lambda: "mismatch" in _kinds(tmp_path / "copy"), 20,
              f"the honest nodes' mismatch in findings.json:\n{c.text()[-2000:]}")
        found = json.loads((tmp_path / "copy" / "findings.json").read_text())["findings"]
        hosts = [f for f in found if f["kind"] == "host"]
        assert len(hosts) == 257 and hosts[-1]["details"]["late_reports"] == 1300 - 256
        assert "diagnosis failed" not in c.text() and c.text().count("besides the 256 named") == 1
        for sock in honest:
            sock.close()
    finally:
        c.stop()
