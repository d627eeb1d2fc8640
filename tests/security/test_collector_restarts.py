"""What a peer's restart count may do to the ranks of others (restarts.py, claims.py): a
real collector process (`watch --listen` on loopback) and peers that speak the wire
protocol themselves, each rank's log opened with its own launch (elastic run, restart
count).

torchrun's agents number launches each on its own (TORCHELASTIC_RESTART_COUNT: the
restarts that agent made), so one host's number is its word alone; on 46da595 it was the
run's: one peer that sent a newer count took a finished rank at once, and one enormous
count made every finished rank of the run a relaunch any claim could take."""

from __future__ import annotations

import json
import threading
import time

import pytest
from simnode import CollectorProcess, connect_node, exits, head_of, send, state, until
from test_collector_claims import _exits
from test_collector_owners import RUN

from distdoctor.collect import wire
from distdoctor.collect.claims import NEWS_QUIET_S
from distdoctor.collect.owners import Owners
from distdoctor.runlog.rundir import ring_path

HUGE = 10**18  # a restart count no agent reaches (torchrun's max_restarts is a few)


class Peer:
    """A peer that opens each rank's log with its own restart count of RUN's elastic run
    (`launches`: rank -> count, or (run id, count)), then, `moving`, sends STATEs whose
    heartbeat moves every 0.25 s until closed."""

    def __init__(self, address, host: str, launches: dict, moving: bool = True):
        self.sock = connect_node(address, host)
        self.ranks = list(launches)
        frames = []
        for r, count in launches.items():
            run, count = count if isinstance(count, tuple) else (RUN["torchelastic_run_id"],
                                                                  count)
            launch = json.dumps({**RUN, "torchelastic_run_id": run,
                                 "torchelastic_restart_count": str(count)}).encode()
            frames += [wire.frame(wire.OPEN, wire.OPEN_BODY.pack(16, 4096, 4000 + r) + launch,
                                  r), state(r)]
        assert send(self.sock, *frames)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        if moving:
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.25):
            send(self.sock, *[state(r) for r in self.ranks])

    def exits(self, code: int | None, signal: str | None = None) -> bool:
        return send(self.sock, exits([{"rank": r, "pid": 4000 + r, "exit_code": code,
                                       "signal": signal, "stopped_by_distdoctor": False}
                                      for r in self.ranks]))

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self.sock.close()


@pytest.mark.timeout(40)
def test_one_hosts_restart_count_takes_no_finished_rank(tmp_path):
    """Node done finishes ranks 0-1 of the run (restart 0; its exit codes came) and stays
    connected. Peer forger, alone, opens its own rank 50 at restart 10^18, claims rank 1
    at that count and rank 0 at restart 0 (a relaunch, were the run restarted), moves
    them and says they were killed. Both stay done's, set aside, with done's exit codes.
    On 46da595 rank 1 passed at once ("it sends an older launch of the job") and rank 0
    as a relaunch (10^18 was the run's restart), and forger's SIGKILL was their exit."""
    copy = tmp_path / "copy"
    collector = CollectorProcess(copy, tmp_path / "collector.out").started()
    peers = []
    try:
        done = Peer(collector.address, "done", {0: 0, 1: 0}, moving=False)
        peers.append(done)
        until(lambda: min(head_of(ring_path(copy, r)) for r in (0, 1)) >= 0, what="copies")
        assert done.exits(0)
        until(lambda: _exits(copy) == {0: (4000, 0), 1: (4001, 0)}, what="done's exits")
        forger = Peer(collector.address, "forger", {50: HUGE, 1: HUGE, 0: 0})
        peers.append(forger)
        collector.wait_for("node forger sends ranks 0-1 of node done: its frames for them "
                           "are set aside: node done finished them")
        time.sleep(NEWS_QUIET_S + 1.0)  # (a move would be said by now)
        assert forger.exits(None, "SIGKILL")
        time.sleep(0.5)
    finally:
        for p in peers:
            p.close()
        collector.stop()
    text = collector.text()
    assert "moved" not in text and "Traceback" not in text, text
    owners = Owners(copy)
    assert (owners.of[0], owners.of[1], owners.of[50]) == ("done", "done", "forger")
    assert {r: e for r, e in _exits(copy).items() if r in (0, 1)} == {
        0: (4000, 0), 1: (4001, 0)}


@pytest.mark.timeout(40)
def test_run_ids_named_first_keep_no_real_runs_restart_out(tmp_path):
    """Peer filler opens 64 ranks first, each of a run id of its own. Then the real run:
    node done finishes rank 0 (restart 0) and stays connected, hosts a1 and a2 run ranks
    2-3 at restart 1 (the run restarted, two agents show it), and a fresh agent's node
    claims rank 0 at restart 0: a relaunch, it takes the rank once done's rank has been
    silent LOST_S. On 46da595 the first 64
    run ids held the run table for good, the real run's restart was never known, and
    fresh's frames were set aside for as long as done stayed ("node done finished it")."""
    copy = tmp_path / "copy"
    collector = CollectorProcess(copy, tmp_path / "collector.out").started()
    peers = []
    try:
        peers.append(Peer(collector.address, "filler",
                          {1000 + i: (f"fill-{i}", 0) for i in range(64)}, moving=False))
        until(lambda: head_of(ring_path(copy, 1063)) >= 0, what="filler's copies")
        done = Peer(collector.address, "done", {0: 0}, moving=False)
        peers.append(done)
        until(lambda: head_of(ring_path(copy, 0)) >= 0, what="done's copy")
        assert done.exits(0)
        until(lambda: _exits(copy).get(0) == (4000, 0), what="done's exit")
        for host, rank in (("a1", 2), ("a2", 3)):
            peers.append(Peer(collector.address, host, {rank: 1}))
        until(lambda: min(head_of(ring_path(copy, r)) for r in (2, 3)) >= 0, what="a1, a2")
        peers.append(Peer(collector.address, "fresh", {0: 0}))
        collector.wait_for("rank 0 moved from node done to node fresh", timeout_s=10)
    finally:
        for p in peers:
            p.close()
        collector.stop()
    assert Owners(copy).of[0] == "fresh"
