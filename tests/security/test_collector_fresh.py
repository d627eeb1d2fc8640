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
from simnode import CollectorProcess, connect_node, dropped, hello, meta, reply, send, until
from test_collector_poison import (
    STUCK,
    _digest,
    _kinds,
    _mismatch_between_honest_nodes,
    _position,
    _row,
)

from distdoctor.collect import wire
from distdoctor.collect.limits import MAX_FINDINGS_BYTES_PER_NODE
from distdoctor.collect.mirror import Mirror
from distdoctor.collect.reports import LATE_MIN_S
from distdoctor.collect.server import Collector, listen
from distdoctor.findings import Finding


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


def _split_digest(i: int, n: int) -> bytes:
    """Node i's digest: its one rank in the job's first all_reduce, for a minute."""
    return _digest(f"gpu-node-{i:04d}.rack", [_position(i, _row(0, "g", 0, done=False,
                                                                t_enter=STUCK))],
                   groups={"g": ["d", list(range(n))]})


@pytest.mark.timeout(60)
def test_a_network_split_of_hundreds_of_nodes_names_every_lost_node(tmp_path):
    """300 nodes in one all_reduce; 150 fall silent. Each lost-node finding listed every
    waiting node (in its summary too): 150 of them were 1.2 MB, past what findings.json
    holds for one source, and none was written or said. Each now names 4 waiting nodes
    in its summary and lists 64 (the counts say how many): all 150 are written."""
    n = 300
    c = CollectorProcess(tmp_path / "copy", tmp_path / "collector.txt",
                         args=("--hang-timeout", "2")).started()
    socks = [connect_node(c.address, f"gpu-node-{i:04d}.rack") for i in range(n)]
    try:
        for i, sock in enumerate(socks):
            assert send(sock, _split_digest(i, n))

        def lost() -> list:
            for i, sock in enumerate(socks[:n // 2]):  # the half that still reports
                send(sock, _split_digest(i, n))
            try:
                found = json.loads((tmp_path / "copy" / "findings.json").read_text())
            except (OSError, ValueError):
                return []
            return [f for f in found["findings"]
                    if f["details"].get("reason") == "lost_node"]

        until(lambda: len(lost()) == n // 2 or time.sleep(0.5), 30,
              f"150 lost nodes in findings.json:\n{c.text()[-1500:]}")
        f = lost()[0]
        assert "and 146 more nodes wait" in f["summary"], f["summary"]
        assert (len(f["details"]["waiting_hosts"]), f["details"]["waiting_hosts_count"],
                f["details"]["waiting_count"]) == (64, 150, 150)
        assert "diagnosis failed" not in c.text()
    finally:
        for sock in socks:
            sock.close()
        c.stop()


def test_the_collectors_own_findings_past_their_bound_keep_the_most_severe(tmp_path):
    """More of the collector's own findings than findings.json holds for one source
    (here 3 MB of them): every write of them failed, so none was written; now the most
    severe that fit are."""
    mirror = Mirror(tmp_path, None, None)
    try:
        infos = [Finding("host", "info", "i" * 1500, []) for _ in range(1000)]
        hangs = [Finding("hang", "error", f"node {i} is lost " + "h" * 1500, [i])
                 for i in range(1000)]
        mirror.set_findings("(collector)", infos + hangs)
        written = json.loads((tmp_path / "findings.json").read_text())["findings"]
        kinds = [f["kind"] for f in written]
        assert len(json.dumps(written)) <= MAX_FINDINGS_BYTES_PER_NODE
        assert kinds and set(kinds) == {"hang"}, kinds[:3]
    finally:
        mirror.close()


def _says(c: CollectorProcess, source: str, host: str, instance: str):
    """A connection from `source` that says HELLO: it, and the collector's answer."""
    sock = socket.create_connection(c.address, timeout=10, source_address=(source, 0))
    sock.sendall(hello(host, instance))
    return sock, reply(sock)


@pytest.mark.timeout(30)
def test_a_node_back_from_a_new_address_replaces_its_dead_connection(tmp_path):
    """A forwarder whose connection died without a reset reaching the collector (a NAT
    that lost its mapping, a failover to the host's other NIC) connects again, with its
    instance, from another address: refused as 'another node by that name' until its old
    connection's 60 s of silence ran out, it then waited its 30 s before asking again.
    It now replaces its old connection; another node of that name is refused as ever."""
    c = CollectorProcess(tmp_path / "copy", tmp_path / "collector.txt").started()
    socks = []
    try:
        old, got = _says(c, "127.0.0.1", "node-a", "fwd-1")
        socks.append(old)
        assert got is not None and got[0] == wire.WELCOME and send(old, meta(0, "node-a"))
        new, got = _says(c, "127.0.0.2", "node-a", "fwd-1")
        socks.append(new)
        assert got is not None and got[0] == wire.WELCOME, got
        assert dropped(old, 10)
        other, got = _says(c, "127.0.0.3", "node-a", "fwd-2")
        socks.append(other)
        assert got is not None and got[0] == wire.REFUSED and b"already connected" in got[3]
        assert send(new, meta(0, "node-a")) and not dropped(new, 1)  # its rank, still
    finally:
        for sock in socks:
            sock.close()
        c.stop()
