"""What one node can make the collector hold (issue 46, items 1 and 6): a real collector
process (`watch --listen` on loopback) and simulated nodes that send real frames. Past a
bound the node is refused with one line and the others go on; the collector's memory,
files and descriptors stay within what collect/limits.py states."""

from __future__ import annotations

import json
import time

import pytest
from simnode import (
    CollectorProcess,
    connect_node,
    dropped,
    exits,
    meta,
    open_log,
    send,
    state,
    until,
)

from distdoctor.collect import wire


@pytest.fixture
def collector(tmp_path):
    c = CollectorProcess(tmp_path / "copy", tmp_path / "collector.out").started()
    yield c
    c.stop()


def _entry(rank: int, code=1) -> dict:
    return {"rank": rank, "pid": 100 + rank, "exit_code": code, "signal": None,
            "stopped_by_distdoctor": False}


@pytest.mark.timeout(60)
def test_an_exits_flood_is_refused_and_the_collector_stays_small(collector, tmp_path):
    """The issue's flood: EXITS frames of tens of thousands of entries each (50 frames
    made a 1.09 GB collector and a 210 MB exits.json). Refused at its first frame."""
    copy = tmp_path / "copy"
    flood = connect_node(collector.address, "flooder")
    rss0 = collector.rss_mib()
    for n in range(4):  # 4 MiB frames, 36,000 ranks each
        frame = exits([_entry(n * 36_000 + r) for r in range(36_000)])
        assert len(frame) < wire.MAX_PAYLOAD
        if not send(flood, frame):
            break
    assert dropped(flood)
    collector.wait_for("EXITS frame of 36,000 processes")
    assert collector.rss_mib() - rss0 < 100
    assert not (copy / "exits.json").exists() or (copy / "exits.json").stat().st_size < 1 << 20
    good = connect_node(collector.address, "good")  # the others go on
    assert send(good, meta(0, "good"), exits([_entry(0, 3)]))
    until(lambda: (copy / "exits.json").exists(), what="the good node's exits")
    assert [p["rank"] for p in json.loads((copy / "exits.json").read_text())["processes"]] == [0]
    good.close()
    assert "Traceback" not in collector.text()


@pytest.mark.timeout(60)
def test_a_bad_exit_code_is_refused_and_diagnose_keeps_the_others(collector, tmp_path):
    """One entry whose exit_code is a string made `diagnose` call exits.json unreadable:
    every node's exit codes were lost. Now that node is refused, and a reader skips a bad
    entry in a file (written by an older collector) and keeps the rest."""
    from distdoctor.diagnosis.postmortem import read_exits

    copy = tmp_path / "copy"
    a = connect_node(collector.address, "node-a")
    assert send(a, meta(0, "node-a"), exits([_entry(0, 7)]))
    until(lambda: (copy / "exits.json").exists(), what="node-a's exits")
    b = connect_node(collector.address, "node-b")
    send(b, meta(1, "node-b"), exits([_entry(1, "boom"), _entry(2, {"x": 1})]))
    assert dropped(b)
    collector.wait_for("EXITS frame has a malformed entry")
    got, notes = read_exits(copy)
    assert {r: e.code for r, e in got.items()} == {0: 7} and not notes, notes
    # a file that holds a bad entry anyway: the good ones are read, the bad one said
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "exits.json").write_text(json.dumps({"processes": [
        _entry(0, 7), _entry(1, "boom"), _entry(2, {"x": 1}), _entry(3, 0)]}))
    got, notes = read_exits(tmp_path / "old")
    assert {r: e.code for r, e in got.items()} == {0: 7, 3: 0}
    assert len(notes) == 1 and "2 process entries unreadable" in notes[0]


@pytest.mark.timeout(60)
def test_a_node_cannot_rewrite_another_nodes_rank(collector, tmp_path):
    """Any node could rewrite another's rank-N.json (META had no owner check) and, once
    the owner's connection ended, its log copy. Another host's frames for a rank are set
    aside while its owner may come back (owners.py); once the rank passes to that host,
    its logs are numbered after the owner's, whose copy stays whole."""
    from distdoctor.collect.owners import RECONNECT_S

    copy = tmp_path / "copy"
    owner = connect_node(collector.address, "owner")
    assert send(owner, meta(5, "owner", local_rank=1), open_log(5), state(5))
    until(lambda: (copy / "ranks" / "rank-00005.ring").exists(), what="rank 5's copy")
    before = (copy / "ranks" / "rank-00005.json").read_bytes()
    ring = (copy / "ranks" / "rank-00005.ring").read_bytes()
    owner.close()  # its connection ends: the rank waits for it a while
    time.sleep(0.5)
    thief = connect_node(collector.address, "thief")
    send(thief, meta(5, "thief", local_rank=9), open_log(5, capacity=64), exits([_entry(5, 0)]))
    collector.wait_for("node thief sends rank 5 of node owner: its frames for it are set "
                       "aside")
    assert (copy / "ranks" / "rank-00005.json").read_bytes() == before
    # (the owner's stream ended without its exit codes: its rank is written as lost)
    assert [(p["rank"], p["exit_code"], p.get("lost_with_node")) for p in json.loads(
        (copy / "exits.json").read_text())["processes"]] == [(5, None, "owner")]
    time.sleep(RECONNECT_S)  # the owner did not come back: the rank passes
    assert send(thief, meta(5, "thief", local_rank=9), open_log(5, capacity=64))
    collector.wait_for("rank 5 moved from node owner to node thief")
    until(lambda: (copy / "ranks" / "rank-00005.1.ring").exists(), what="thief's copy")
    assert (copy / "ranks" / "rank-00005.json").read_bytes() == before
    assert (copy / "ranks" / "rank-00005.ring").read_bytes() == ring
    assert json.loads((copy / "ranks" / "rank-00005.1.json").read_text())["host"] == "thief"
    thief.close()
    assert "Traceback" not in collector.text()


@pytest.mark.timeout(60)
def test_findings_and_digests_past_their_bounds_are_refused(collector, tmp_path):
    """Each new finding was kept and printed whole, escape codes and all (20 frames:
    66 MB of collector, 60.8 MB of stderr); a digest of a million ranks took 1.06 GB."""
    noisy = connect_node(collector.address, "noisy")
    big = "\x1b[2J\x1b]0;owned\x07" + "x" * 30_000
    for n in range(12):  # 100 new findings a frame; 1,000 a node at most
        items = [{"kind": "comm_error", "severity": "error", "summary": f"{n}-{i} {big}",
                  "ranks": [], "details": {"source": "log"}} for i in range(100)]
        if not send(noisy, wire.json_frame(wire.FINDINGS, {"findings": items})):
            break
    assert dropped(noisy)
    out = collector.wait_for("more than 1,000 findings from one node")
    assert "\x1b" not in out and len(out) < 5 << 20, len(out)
    findings = json.loads((tmp_path / "copy" / "findings.json").read_text())["findings"]
    assert max(len(f["summary"]) for f in findings) <= 2000
    digest = connect_node(collector.address, "digester")
    send(digest, wire.json_frame(wire.DIGEST, {
        "host": "digester", "groups": {}, "sigs": {}, "arrivals": [], "waits": [],
        "ranks": [[r, None, None, {}, 0, None, False] for r in range(50_000)]}))
    assert dropped(digest)
    collector.wait_for("DIGEST frame of 50,000 ranks")
    assert collector.rss_mib() < 400
    assert "Traceback" not in collector.text()


@pytest.mark.timeout(90)
@pytest.mark.parametrize("nodes", [1, 4])
def test_hundreds_of_ranks_under_a_low_open_files_limit(tmp_path, nodes):
    """Every rank's copy kept two descriptors open for good: under `ulimit -n 256`, one
    node sending 300 OPEN frames made the collector deaf. Now every rank's copy is made,
    the descriptors stay bounded, and a node that comes later still gets in."""
    copy = tmp_path / "copy"
    c = CollectorProcess(copy, tmp_path / "collector.out", ulimit_n=256).started()
    try:
        per_node = 320 // nodes
        socks = [connect_node(c.address, f"node{n}") for n in range(nodes)]
        for n, sock in enumerate(socks):
            for r in range(n * per_node, (n + 1) * per_node):
                assert send(sock, meta(r, f"node{n}"), open_log(r), state(r)), c.text()[-2000:]
        until(lambda: len(list((copy / "ranks").glob("*.ring"))) == 320, 30,
              "320 copies")
        for sock in socks:  # every copy written again: let go, reopened, written on
            assert send(sock, *[state(r, head=0) for r in range(320)
                                if r // per_node == socks.index(sock)])
        late = connect_node(c.address, "late")
        assert send(late, meta(999, "late"), open_log(999), state(999))
        until(lambda: (copy / "ranks" / "rank-00999.ring").exists(), 15, "the late node")
        # the copies' budget and the viewer's (a quarter of the limit each), the nodes, 32
        assert c.fds() <= 2 * (256 // 4) + nodes + 1 + 32, c.fds()
        assert "Too many open files" not in c.text() and "Traceback" not in c.text()
        for sock in [*socks, late]:
            sock.close()
    finally:
        c.stop()
