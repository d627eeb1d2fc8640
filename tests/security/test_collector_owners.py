"""Who sends a rank to the collector, and when it passes to another node (owners.py): a
real collector process (`watch --listen` on loopback), real node forwarders over real
rank logs whose heartbeats move, and peers that speak the wire protocol themselves.

A rank belonged to the first host that sent it, for good (and across a restart of the
collector, owners.jsonl): a replacement node, or a node renamed after a reboot, was
refused for the rest of the run ("rank 0 belongs to node node-a", and dropped with all
its ranks), and a peer that claimed ranks it does not run kept the real node out."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest
from simnode import CollectorProcess, connect_node, head_of, send, state, until

from distdoctor.collect import wire
from distdoctor.collect.claims import NEWS_QUIET_S
from distdoctor.collect.forward import Forwarder
from distdoctor.collect.owners import RECONNECT_S
from distdoctor.runlog import format as F
from distdoctor.runlog.ring import RingWriter
from distdoctor.runlog.rundir import rank_meta_path, ring_path, write_json_atomic

RUN = {"torchelastic_run_id": "job7", "world": 32}


class Node:
    """A node's run dir of rank logs that run (events and heartbeats), forwarded by a real
    Forwarder that names `host`."""

    def __init__(self, tmp_path, host: str, ranks, address, restart: int | None = None,
                 meta: bool = False):
        self.dir = tmp_path / host
        (self.dir / "ranks").mkdir(parents=True)
        launch = None if restart is None else {**RUN, "torchelastic_restart_count": str(restart)}
        for r in ranks if meta else ():  # (the forwarder sends a log's META before its OPEN)
            write_json_atomic(rank_meta_path(self.dir, r), {"rank": r, "host": host})
        self.writers = {r: RingWriter(str(ring_path(self.dir, r)), r, 64 * F.SLOT_SIZE, 4096,
                                      pid=4000 + r, launch=launch) for r in ranks}
        self.seq = 0
        self.halted: set[int] = set()  # ranks whose process stopped (no event, no heartbeat)
        self.step()
        self.forwarder = Forwarder(self.dir, address)
        self.forwarder.host = host
        self.forwarder.start()

    def step(self) -> None:
        for w in [w for r, w in self.writers.items() if r not in self.halted]:
            e = w.append(F.KIND_COLLECTIVE, F.OP_CODE["all_reduce"], 0, 0, 0, 0, self.seq, -1,
                         0, 1, 1, 1000 + self.seq, 0, 0)
            w.complete(e, F.STATUS_OK, 2000 + self.seq)
            w.heartbeat()
        self.seq += 1

    def stop(self, exits: list[dict] | None = None) -> None:
        """The node's job ends (with its exit codes, where given): once."""
        if self.writers:
            self.forwarder.stop(exits=exits)
        for w in self.writers.values():
            w.close()
        self.writers = {}


class Running:
    """Every node's ranks run (a step and a heartbeat every 0.2 s) until the block ends."""

    def __init__(self, *nodes):
        self.nodes = list(nodes)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            for node in list(self.nodes):
                node.step()

    def __enter__(self) -> Running:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


class Squatter:
    """A peer that claims ranks it does not run: OPEN and STATE of each (or a DIGEST),
    then, with `moving`, a STATE (a DIGEST) whose heartbeat moves every 0.25 s."""

    def __init__(self, address, host: str, ranks, digest: bool = False, moving: bool = False,
                 launch: dict | None = None):
        self.sock = connect_node(address, host)
        self.host, self.ranks, self.digest, self.launch = host, list(ranks), digest, launch
        self._stop = threading.Event()
        self.send()
        self._thread = threading.Thread(target=self._run, daemon=True)
        if moving:
            self._thread.start()

    def send(self) -> bool:
        if self.digest:
            now = time.monotonic_ns()
            return send(self.sock, wire.json_frame(wire.DIGEST, {
                "host": self.host, "groups": {}, "sigs": {}, "arrivals": [], "waits": [],
                "ranks": [[r, None, None, {}, now, None, False] for r in self.ranks]}))
        extra = json.dumps(self.launch).encode() if self.launch else b""
        frames = [f for r in self.ranks for f in (
            wire.frame(wire.OPEN, wire.OPEN_BODY.pack(16, 4096, 9000 + r) + extra, r),
            state(r, head=0))]
        return send(self.sock, *frames)

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            if self.digest:
                self.send()
            else:
                send(self.sock, *[state(r, head=0) for r in self.ranks])

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self.sock.close()


@pytest.fixture
def collector(tmp_path):
    c = CollectorProcess(tmp_path / "copy", tmp_path / "collector.out").started()
    yield c
    c.stop()


@pytest.mark.timeout(60)
def test_ranks_pass_to_a_new_node_once_their_owner_is_gone(collector, tmp_path):
    """A node that died, replaced by another host running its ranks; a squatter (logs,
    then digests) that went quiet, and the node that runs the ranks: each rank passes to
    the node where it runs, with one line, the old owner's copy kept whole."""
    copy, address = tmp_path / "copy", collector.address
    a = Node(tmp_path, "node-a", [0, 1], address)
    until(lambda: head_of(ring_path(copy, 1)) >= 1, what="node-a's copies")
    squat = Squatter(address, "squat", [4, 5])
    dsquat = Squatter(address, "dsquat", [10, 11], digest=True)
    a_head = head_of(ring_path(copy, 0))
    a.stop()  # the node dies: its stream ends without its exit codes
    b = Node(tmp_path, "node-b", [0, 1], address)  # its replacement, same ranks
    real = Node(tmp_path, "real", [4, 5], address)
    dreal = Squatter(address, "dreal", [10, 11], digest=True, moving=True)
    try:
        with Running(b, real):
            collector.wait_for("ranks 0-1 moved from node node-a to node node-b")
            until(lambda: head_of(ring_path(copy, 0, 1)) > 3, what="node-b's copy of rank 0")
            collector.wait_for("ranks 10-11 moved from node dsquat to node dreal")
            collector.wait_for("ranks 4-5 moved from node squat to node real")
            until(lambda: head_of(ring_path(copy, 4, 1)) > 3, what="real's copy of rank 4")
    finally:
        for n in (b, real):
            n.stop()
        for s in (squat, dsquat, dreal):
            s.close()
    assert head_of(ring_path(copy, 0)) == a_head  # node-a's own copy, whole
    text = collector.text()
    assert "(node-a: its stream ended" in text and "(squat: no sign of the rank" in text
    from distdoctor.collect.owners import Owners

    owners = Owners(copy)  # as a collector started again on the copy reads them
    assert {r: (owners.of[r], owners.base.get(r, 0)) for r in (0, 1, 4, 5, 10, 11)} == {
        0: ("node-b", 1), 1: ("node-b", 1), 4: ("real", 1), 5: ("real", 1),
        10: ("dreal", 0), 11: ("dreal", 0)}
    assert "Traceback" not in text


@pytest.mark.timeout(60)
def test_a_live_owner_keeps_its_ranks_and_two_live_claims_are_a_conflict(collector,
                                                                         tmp_path):
    """A node that runs its ranks keeps them: another's claim is set aside, said once, and
    that node's own ranks go on; a newer launch of the job takes them at once; a peer
    that keeps moving ranks the real node also runs (and a node that runs ranks of
    another: rank 20; a forged newer launch, which takes the rank at once: rank 23) is a
    conflict, said with both hosts and the ranks, once, and written as a finding."""
    copy, address = tmp_path / "copy", collector.address
    owner = Node(tmp_path, "owner", [20, 21, 23], address, restart=0)
    squat = Squatter(address, "squat", [6, 7], moving=True)
    until(lambda: head_of(ring_path(copy, 21)) >= 1, what="owner's copies")
    other = Node(tmp_path, "other", [20, 22], address)
    owner.halted.add(21)  # torchrun stopped rank 21 and restarted it on another node
    restarted = Node(tmp_path, "restarted", [21], address, restart=1)
    real = Node(tmp_path, "real", [6, 7, 8], address)
    forger = Squatter(address, "forger", [23], moving=True,  # a launch it does not run
                      launch={**RUN, "torchelastic_restart_count": "9"})
    try:
        with Running(owner, other, restarted, real):
            collector.wait_for("rank 21 moved from node owner to node restarted (owner: it "
                               "sends an older launch of the job)")
            collector.wait_for("node other sends rank 20 of node owner: its frames for it "
                               "are set aside while node owner runs it")
            collector.wait_for("rank conflict: node squat and node real both send ranks 6-7")
            collector.wait_for("rank conflict: node forger and node owner both send rank 23")
            until(lambda: head_of(ring_path(copy, 22)) > 3 and head_of(ring_path(copy, 8)) > 3,
                  what="the claimants' own ranks")
            time.sleep(2.0)  # dozens of frames of the ranks set aside: no line more
    finally:
        for n in (owner, other, restarted, real):
            n.stop()
        squat.close()
        forger.close()
    text = collector.text()
    assert text.count("node other sends rank 20") == 1, text
    assert text.count("rank conflict: node squat and node real") == 1, text
    assert text.count("node real sends ranks 6-7 of node squat") == 1, text
    assert "dropped" not in text, text  # set aside, never dropped: their other ranks go on
    found = [f for f in json.loads((copy / "findings.json").read_text())["findings"]
             if f["details"].get("reason") == "rank_conflict"]
    assert sorted((f["ranks"], f["details"]["hosts"]) for f in found) == [
        ([6, 7], ["squat", "real"]), ([20], ["owner", "other"]), ([23], ["forger", "owner"])]
    # the forger holds rank 23 by its word (a newer launch), not by having it first
    # (28b2364 said "it had it first", and that the owner's were set aside)
    forged = next(f["summary"] for f in found if f["ranks"] == [23])
    assert "(it sent a newer launch of the job, node owner runs it on)" in forged, forged
    assert "Traceback" not in text



@pytest.mark.timeout(60)
def test_a_healthy_handover_is_no_conflict_and_no_set_aside(collector, tmp_path):
    """Ranks that stop on one host and start on another (torchrun's restart onto a
    replacement node, its META before its OPEN; a relaunch without elastic identity a
    moment after the old rank stopped, its host still running others) pass with one line
    each: no rank_conflict finding, the elastic one never set aside, its metadata in the
    copy; and stay where they are when the collector starts again. On 28b2364: a conflict
    (both moved "within 5 s"), the META set aside (claimed without its launch), and rank 0
    moved back and forth after the restart."""
    copy, address = tmp_path / "copy", collector.address
    a = Node(tmp_path, "node-a", [0, 1], address, restart=0, meta=True)
    c = Node(tmp_path, "node-c", [2, 3], address)
    until(lambda: min(head_of(ring_path(copy, r)) for r in (1, 3)) >= 1, what="copies")
    try:
        with Running(a, c) as running:
            time.sleep(0.5)  # the owners' ranks move a while
            a.halted.add(0)  # torchrun stops rank 0 ... and starts it on node-b
            c.halted.add(2)  # rank 2 stops ... and is started again on node-d
            time.sleep(0.3)
            b = Node(tmp_path, "node-b", [0], address, restart=1, meta=True)
            d = Node(tmp_path, "node-d", [2], address)
            running.nodes += [b, d]
            collector.wait_for("rank 0 moved from node node-a to node node-b")
            collector.wait_for("rank 2 moved from node node-c to node node-d", timeout_s=15)
            until(lambda: head_of(ring_path(copy, 2, 1)) > 3, what="node-d's copy")
            time.sleep(1.0)  # (a conflict, a line, would be said by now)
            text = collector.text()
            # the collector started again on its copy: node-a, which sends its log of
            # rank 0 (killed, never closed) on every connection, is back before node-b
            # (forwarders back off up to 30 s): rank 0 stays node-b's (on 28b2364 node-a's
            # old log took it 2 s after the start, and node-b's took it back as rank 0.2)
            b.forwarder.stop()
            collector.stop()
            again = CollectorProcess(copy, tmp_path / "again.out", port=collector.port)
            try:
                again.started()
                h1 = head_of(ring_path(copy, 1))
                until(lambda: head_of(ring_path(copy, 1)) > h1 + 3, what="node-a back")
                time.sleep(RECONNECT_S + 0.5)
                # node-a's job ends first: its exit codes name its killed rank 0 too (an
                # exit code is the rank's past: on d926bc1 it took rank 0 from node-b)
                a.forwarder.stop(exits=[
                    {"rank": 0, "pid": 4000, "exit_code": -9, "signal": "SIGKILL",
                     "stopped_by_distdoctor": False},
                    {"rank": 1, "pid": 4001, "exit_code": 0, "signal": None,
                     "stopped_by_distdoctor": False}])
                again.wait_for("finished")
                h0 = head_of(ring_path(copy, 0, 1))
                b.forwarder = Forwarder(b.dir, again.address)
                b.forwarder.host = "node-b"
                b.forwarder.start()
                until(lambda: head_of(ring_path(copy, 0, 1)) > h0 + 3, what="node-b back")
                time.sleep(NEWS_QUIET_S)
            finally:
                again.stop()
    finally:
        for n in (a, c, b, d):
            n.stop()
    after = again.text()
    assert "moved" not in after and "sends rank" not in after, after
    assert not ring_path(copy, 0, 2).exists()
    assert [p["rank"] for p in json.loads((copy / "exits.json").read_text())["processes"]
            if p["signal"] == "SIGKILL"] == []
    assert "rank conflict" not in text and "sends rank 0" not in text, text
    found = json.loads((copy / "findings.json").read_text())["findings"] \
        if (copy / "findings.json").exists() else []
    assert not [f for f in found if f["details"].get("reason") == "rank_conflict"], found
    assert json.loads((copy / "ranks" / "rank-00000.1.json").read_text())["host"] == "node-b"
    assert json.loads((copy / "ranks" / "rank-00000.json").read_text())["host"] == "node-a"
    assert "Traceback" not in text


def _ping_pong(copy, address, rank: int, moves: int, first_log: int = 0) -> float:
    """Two peers that take `rank` from each other by forged newer launches (each a new
    log, as a restart's is: a former owner's old logs are the rank's past, no claim), one
    move at a time (each waited for: a line of owners.jsonl): the seconds they took."""
    owners, socks = copy / "owners.jsonl", [connect_node(address, f"flip{rank}-{i}")
                                            for i in range(2)]

    def lines() -> int:
        return owners.read_bytes().count(b"\n") if owners.exists() else 0

    try:
        start = time.monotonic()
        for n in range(moves + 1):
            before, launch = lines(), {**RUN, "torchelastic_restart_count": str(n)}
            assert send(socks[n % 2], wire.frame(wire.OPEN, wire.OPEN_BODY.pack(
                16, 4096, 9000) + json.dumps(launch).encode(), rank, log=first_log + n))
            until(lambda b=before: lines() > b, timeout_s=10, what=f"move {n} of rank {rank}")
        return time.monotonic() - start
    finally:
        for s in socks:
            s.close()


@pytest.mark.timeout(60)
def test_moving_a_rank_to_and_fro_costs_the_same_each_time(collector, tmp_path):
    """Each move numbered the new owner's logs after the copy's by a stat per number from
    0: a rank with many logs in the copy (10,000 here, a collector's copy of a long run,
    or of a peer that moved it to and fro) made each move cost that many stats, on the
    collector's event loop. Now read once a rank: 30 moves of such a rank take about
    what 30 of a fresh one take (on 28b2364: 15.1 s against 1.2 s)."""
    copy, address = tmp_path / "copy", collector.address
    first = copy / "ranks" / "rank-00007.json"
    first.write_bytes(b"{}\n")
    for n in range(1, 10_000):  # the first peer's logs of rank 7 so far (links: 10x faster)
        os.link(first, copy / "ranks" / f"rank-00007.{n}.json")
    fresh = _ping_pong(copy, address, 8, 30)
    many = _ping_pong(copy, address, 7, 30, first_log=10_000)
    print(f"30 moves: {many:.2f} s with 10,000 logs, {fresh:.2f} s fresh")
    assert many < 3 * fresh + 1.0, (many, fresh)
    assert "Traceback" not in collector.text()
