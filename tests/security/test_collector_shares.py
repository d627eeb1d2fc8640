"""A collector-wide cap filled by one peer must not lock the real nodes out (collect/
shares.py): a real collector process (`watch --listen` on loopback), a hog that speaks the
protocol through distdoctor.collect.wire, and real nodes whose digests and findings are
made by the code a node's `run` uses (DigestBuilder, Finding). The node holding the most
of a full cap goes (one line naming it), the real node's smaller share comes in."""

from __future__ import annotations

import json
import socket

import pytest
from simnode import CollectorProcess, connect_node, dropped, send, until

from distdoctor.collect import wire
from distdoctor.collect.digest import DigestBuilder
from distdoctor.collect.fleet import MAX_GROUPS, MAX_OPEN
from distdoctor.collect.limits import MAX_DIGEST_GROUPS, MAX_FINDINGS_BYTES_PER_NODE
from distdoctor.diagnosis.engine.core import Engine
from distdoctor.findings import Finding
from distdoctor.runlog.reader import Event


@pytest.fixture
def collector(tmp_path):
    c = CollectorProcess(tmp_path / "copy", tmp_path / "collector.out").started()
    yield c
    c.stop()


def _op(rank: int, seq: int, ranks: tuple, numel: int = 64) -> Event:
    return Event(rank=rank, index=seq, kind="collective", op="all_reduce", status="ok",
                 group="0", group_desc="default_pg", group_ranks=ranks, seq=seq, peer=None,
                 shapes=((numel,),), dtypes=("float32",), device="cpu", numel_in=numel,
                 numel_out=numel, reduce_op="sum",
                 callsite={"file": "/job/t.py", "line": 9, "function": "f"},
                 t_enter_ns=seq * 10**6, t_end_ns=seq * 10**6 + 1000, span_index=0,
                 name=None, error=None, is_async=False, other_thread=False)


def _real_payload(host: str, ranks: tuple, numel: int = 64) -> dict:
    """A node's digest as its `run --forward-digest` makes it: its ranks' positions, its
    group (named for the first time) and the collectives they entered."""
    events = [_op(r, seq, (0, 1, 2, 3), numel) for seq in range(3) for r in ranks]
    engine, builder = Engine(), DigestBuilder()
    engine.ingest(events, 1.0)
    builder.feed(events)
    payload = builder.take(engine, 1.0, host)
    assert payload["groups"] and payload["ranks"]
    return json.loads(json.dumps(payload))  # (as the collector reads it)


def _real_digest(host: str, ranks: tuple, numel: int = 64) -> bytes:
    return wire.frame(wire.DIGEST, json.dumps(_real_payload(host, ranks, numel)).encode())


def _groups_frame(first: int, n: int) -> bytes:
    groups = {f"hog{first + i}": ["", [0]] for i in range(n)}
    return wire.json_frame(wire.DIGEST, {"groups": groups, "sigs": {}, "ranks": [],
                                         "arrivals": []})


def _read_by_collector(*socks) -> None:
    """Until the collector has read every byte sent on `socks` (their send queues empty),
    and a moment to apply the last frames: frames of two connections are applied in the
    order the collector reads them."""
    import fcntl
    import struct
    import termios
    import time

    def unsent(sock) -> int:
        return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0" * 4))[0]

    until(lambda: not any(unsent(s) for s in socks), what="the collector to read the frames")
    time.sleep(0.3)


def _kept(sock, seconds: float = 1.5) -> bool:
    return not dropped(sock, seconds)


@pytest.mark.timeout(60)
def test_a_peer_that_fills_the_groups_cap_goes_and_real_nodes_get_in(collector):
    """The hog names MAX_GROUPS groups (32 frames of 4,096, no rank of its own): before,
    every later node naming its group was dropped ('the collector holds 131,072 groups
    already'); now the hog, which holds the most, goes with one line, and the nodes in."""
    hog = connect_node(collector.address, "hog")
    for first in range(0, MAX_GROUPS, MAX_DIGEST_GROUPS):
        assert send(hog, _groups_frame(first, MAX_DIGEST_GROUPS))
    _read_by_collector(hog)
    a = connect_node(collector.address, "node-a")
    assert send(a, _real_digest("node-a", (0, 1)))
    assert _kept(a), collector.text()[-2000:]
    assert dropped(hog, 5)
    b = connect_node(collector.address, "node-b")  # a second node: the room is there
    assert send(b, _real_digest("node-b", (2, 3)))
    assert _kept(b), collector.text()[-2000:]
    text = collector.text()
    lines = [line for line in text.splitlines() if "hog" in line and "group" in line]
    assert len(lines) == 1 and "131,072" in lines[0], text[-2000:]
    assert "dropped node node-" not in text, text[-2000:]
    print(lines[0])
    assert "Traceback" not in text
    for s in (a, b):
        s.close()


def _findings_frame(host: str, n: int, total: int) -> bytes:
    """`n` findings of about `total` bytes of JSON in all, as a node's FINDINGS frame."""
    def found(pad: int) -> list[dict]:  # (a detail's text is kept to 1,000 characters)
        details = {"source": "log", **{f"line{k}": "x" * 1000 for k in range(pad // 1010)},
                   "last": "x" * (pad % 1010)}
        return [Finding(kind="comm_error", severity="error", summary=f"{host} error {i}",
                        details=details).to_json() for i in range(n)]

    pad = (total - len(json.dumps(found(0)))) // n
    while len(json.dumps(found(pad))) > total:
        pad -= 20
    return wire.json_frame(wire.FINDINGS, {"findings": found(pad)})


@pytest.mark.timeout(60)
def test_peers_that_fill_the_findings_cap_go_and_a_real_nodes_finding_is_kept(
        collector, tmp_path):
    """Eight hogs of ~1 MiB of findings each fill the collector-wide 8 MiB: before, every
    real node's FINDINGS frame was refused; now one hog goes (its findings with it)."""
    hogs = []
    for h in range(8):
        s = connect_node(collector.address, f"hog{h}")
        assert send(s, _findings_frame(f"hog{h}", 80, MAX_FINDINGS_BYTES_PER_NODE - 100))
        hogs.append(s)
    _read_by_collector(*hogs)
    copy = tmp_path / "copy" / "findings.json"
    until(lambda: copy.exists() and "hog7 error 79" in copy.read_text(),
          what="the hogs' findings")
    real = connect_node(collector.address, "real")
    assert send(real, _findings_frame("real", 1, 3000))
    assert _kept(real), collector.text()[-2000:]
    until(lambda: "real error 0" in copy.read_text(),
          what="the real node's finding in findings.json")
    assert sum(dropped(s, 0.5) for s in hogs) == 1, collector.text()[-3000:]
    assert "Traceback" not in collector.text()
    real.close()


def test_a_node_that_fills_the_group_members_cap_goes_for_a_real_nodes_group():
    """The members' cap (8,388,608, summed over all groups) filled by one node's 32
    groups of 262,144 members: a real node's group of 4 comes in, the hog's go, and a
    hog that is the biggest holder itself is refused, the total within the cap."""
    from distdoctor.collect.fleet import MAX_GROUP_MEMBERS, FleetEngine
    from distdoctor.collect.limits import MAX_RANKS

    fleet = FleetEngine()
    members = [0] * MAX_RANKS
    hog = {"host": "hog", "groups": {f"big{i}": ["", members] for i in range(32)},
           "sigs": {}, "ranks": [], "arrivals": []}
    fleet.apply(hog)
    assert sum(fleet.sizes.values()) == MAX_GROUP_MEMBERS
    fleet.apply(_real_payload("real", (0, 1)))
    assert set(fleet.groups) == {"0"} and "hog" in fleet.evicted
    assert "group members" in fleet.evicted["hog"]
    fleet.apply({**hog, "groups": {f"big{i}": ["", members] for i in range(31)}})
    again = {**hog, "groups": {"big99": ["", members]}}
    with pytest.raises(wire.WireError, match="no node that holds more than node hog"):
        fleet.apply(again)
    assert sum(fleet.sizes.values()) <= MAX_GROUP_MEMBERS


def test_nodes_that_fill_the_ranks_cap_go_for_a_real_nodes_ranks(tmp_path, monkeypatch):
    """Hosts of 1,024 ranks each (a node's most) fill the collector-wide cap on ranks
    (262,144; 4,096 here, to stay quick): before, every later node's digest was refused
    ('the collector holds 262,144 ranks already'); now one of them goes for the real
    node's 2 ranks, its next frame refused with the line, and a collector started again
    on the copy reads the owners so."""
    from distdoctor.collect.mirror import Mirror, NodeMirror

    monkeypatch.setattr("distdoctor.collect.mirror.MAX_RANKS", 4096)
    mirror = Mirror(tmp_path / "copy")
    hogs = [NodeMirror(mirror, {"host": f"hog{h}"}) for h in range(4)]

    def digest(node, payload) -> None:
        node.apply(wire.DIGEST, 0, 0, json.dumps(payload).encode())

    for h, node in enumerate(hogs):
        digest(node, {"groups": {}, "sigs": {}, "arrivals": [], "ranks": [
            [r, None, None, {}, None, None, False] for r in range(10 + 1024 * h,
                                                                   10 + 1024 * (h + 1))]})
    digest(NodeMirror(mirror, {"host": "real"}), _real_payload("real", (0, 1)))
    assert list(mirror.evicted) == ["hog0"] and mirror.owners.of[0] == "real"
    assert 10 not in mirror.fleet.positions and len(mirror.owners.of) <= 4096
    with pytest.raises(wire.WireError, match="held 1,024 of the collector's 4,096 ranks"):
        digest(hogs[0], {"groups": {}, "sigs": {}, "arrivals": [], "ranks": []})
    mirror.close()
    again = Mirror(tmp_path / "copy")
    assert "hog0" not in again.owners.count and again.owners.of[1] == "real"
    again.close()


@pytest.mark.timeout(60)
def test_a_peer_holding_every_node_connection_keeps_no_real_node_out(tmp_path):
    """A peer (127.0.0.2) opens MAX_NODES node connections under new host names: before,
    every later node was refused ('1024 nodes connected already'); now the least recently
    heard of the peer's goes for a real node, and the peer's own next is refused."""
    import resource

    from simnode import hello, reply
    from test_collector_attacks import real_node_gets_in

    from distdoctor.collect.serving import MAX_NODES

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = MAX_NODES + 256
    if hard != resource.RLIM_INFINITY and hard < need:
        pytest.skip(f"{need} open files needed (ulimit -Hn is {hard})")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, need), hard))
    c = CollectorProcess(tmp_path / "copy", tmp_path / "collector.out")
    socks = []
    try:
        c.started()
        for n in range(MAX_NODES):
            s = socket.create_connection(c.address, timeout=5,
                                         source_address=("127.0.0.2", 0))
            socks.append(s)
            s.sendall(hello(f"peer{n}"))
        for s in socks:
            got = reply(s)
            assert got is not None and got[0] == wire.WELCOME, c.text()[-2000:]
        s = socket.create_connection(c.address, timeout=5, source_address=("127.0.0.2", 0))
        socks.append(s)
        s.sendall(hello("peer-more"))
        assert reply(s)[0] == wire.REFUSED
        ok, why = real_node_gets_in(c.address, tmp_path / "node", host="real")
        assert ok, (why, c.text()[-2000:])
        assert dropped(socks[0], 5)  # the least recently heard (its line: in the minute's
        assert "Traceback" not in c.text()  # news, past the 200 lines of 1,024 connected)
    finally:
        for s in socks:
            s.close()
        c.stop()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _open_flood(host: str, rank: int, first: int, row: list) -> bytes:
    """MAX_OPEN collectives on a group of the peer's own no other node enters, each
    half-joined (its one rank of two): they stay open."""
    runs = [[host, first + k * 50_000, 0, [rank], 50_000] for k in range(MAX_OPEN // 50_000)]
    return wire.json_frame(wire.DIGEST, {
        "host": host, "groups": {host: ["", [rank, rank + 1]]}, "sigs": {"0": row},
        "ranks": [[rank, None, None, {}, None, None, False]], "arrivals": runs})


@pytest.mark.timeout(30)
def test_a_peer_that_fills_the_open_collectives_goes_and_a_mismatch_is_found(
        collector, tmp_path):
    """A peer keeps MAX_OPEN collectives open on a group of its own: before, each of its
    floods pushed the real nodes' open collectives out (the oldest went), and node-b's
    differing shape met nothing of node-a's: no mismatch, nothing said. Now the peer,
    which holds the most, goes with one line, and the mismatch is found."""
    row = _real_payload("x", (0, 1))["sigs"]["0"]
    hog = connect_node(collector.address, "hog")
    assert send(hog, _open_flood("hog", 100, 0, row))
    _read_by_collector(hog)
    a = connect_node(collector.address, "node-a")
    assert send(a, _real_digest("node-a", (0, 1)))
    _read_by_collector(a)
    send(hog, _open_flood("hog", 100, MAX_OPEN, row))  # (refused now: it was let go)
    b = connect_node(collector.address, "node-b", timeout_s=20)  # (after the flood)
    assert send(b, _real_digest("node-b", (2, 3), numel=65))
    copy = tmp_path / "copy" / "findings.json"
    until(lambda: copy.exists() and '"mismatch"' in copy.read_text(), timeout_s=8,
          what=f"the nodes' mismatch: {collector.text()[-1500:]}")
    text = collector.text()
    lines = [line for line in text.splitlines() if "hog" in line and "open collectives" in line]
    assert len(lines) == 1 and "200,000" in lines[0], text[-2000:]
    assert dropped(hog, 5) and _kept(a) and _kept(b), text[-2000:]
    assert "Traceback" not in text
    for s in (a, b):
        s.close()


def test_nodes_that_fill_the_signatures_cap_go_and_a_real_nodes_signatures_stay(
        monkeypatch):
    """Hosts of many distinct signatures (shapes that never repeat) fill MAX_SIGNATURES
    (4,096 here, to stay quick): before, the table kept only what open collectives used,
    and a real node's signature, sent once, was forgotten: its next collectives were
    dropped and a mismatch of them went unseen. Now the biggest holder goes, with one
    line, the total within the cap, and the real node's collectives still meet."""
    from distdoctor.collect.fleet import FleetEngine

    for where in ("shares", "fleet"):  # (fleet: where the code before shares.py had it)
        monkeypatch.setattr(f"distdoctor.collect.{where}.MAX_SIGNATURES", 4096,
                            raising=False)
    fleet = FleetEngine(settle_s=0.0)
    first = _real_payload("node-a", (0, 1))
    fleet.apply(first, now_s=1.0)
    fleet.apply(_real_payload("node-b", (2, 3)), now_s=1.0)  # seq 0-2: met and agreed
    row = first["sigs"]["0"]
    for h, many in enumerate((1400, 1300, 1200, 1100)):
        sigs = {str(n): [*row[:9], n + 10_000 * (h + 1), n + 10_000 * (h + 1), *row[11:]]
                for n in range(many)}
        fleet.apply({"host": f"hog{h}", "groups": {}, "sigs": sigs, "ranks": [],
                     "arrivals": []}, now_s=1.0)
    later = {**first, "groups": {}, "sigs": {},
             "arrivals": [["0", 7, 0, [0, 1], 1]]}  # (its signature: sent in `first`)
    fleet.apply(later, now_s=2.0)
    other = _real_payload("node-b", (2, 3), numel=65)
    other.update(groups={}, sigs={"1": other["sigs"]["0"]},
                 arrivals=[["0", 7, 1, [2, 3], 1]])
    fleet.apply(other, now_s=2.0)
    found = fleet.tick(now_s=3.0)
    assert [(f.kind, f.seq) for f in found] == [("mismatch", 7)], found
    assert list(fleet.evicted) == ["hog0"], fleet.evicted
    assert "1,400 of the collector's 4,096 signatures" in fleet.evicted["hog0"]
    assert fleet.sigs.total <= 4096 and len(fleet.sigs.events) <= 4096
