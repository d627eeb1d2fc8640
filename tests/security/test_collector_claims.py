"""Claims the collector knows to be false (claims.py): a real collector process (`watch
--listen` on loopback, its viewer's findings printed), real node forwarders over rank logs
whose heartbeats move, and peers that speak the wire protocol themselves.

On 23bbc3e: a peer's forged newer launch took a rank its node ran on and kept it after
the conflict was proven (the node's frames were its copy's no more); and the logs of a squatter (the forger's, one that never ran the rank it claimed first) stayed
in the copy's ranks/, where the viewer took them for the rank and said it crashed."""

from __future__ import annotations

import json
import os
import stat
import time

import pytest
from simnode import CollectorProcess, connect_node, head_of, open_log, send, until
from test_collector_owners import RUN, Node, Running, Squatter

from distdoctor.collect.owners import RECONNECT_S, Owners
from distdoctor.runlog import format as F
from distdoctor.runlog.ring import RingWriter
from distdoctor.runlog.rundir import ring_path

DONE = [{"rank": r, "pid": 4000 + r, "exit_code": 0, "signal": None,
         "stopped_by_distdoctor": False} for r in (0, 1, 3)]
UNHEARD_S = 11  # the viewer says a rank whose heartbeat stopped this long died (10 s)


@pytest.mark.timeout(60)
def test_a_peer_takes_no_running_nor_finished_rank_and_its_logs_are_no_rank(tmp_path):
    """Rank 23 runs on node owner when node forger claims it by a newer launch it does
    not run: once both have moved it for 5 s, the rank is owner's again, as it was, and
    forger's log is out of ranks/. Node done finishes ranks 0-1 and 3 (its exit codes,
    then its stream ends): the job run again on node spare under the same launch takes
    rank 0 once done has left, and its exit code is the rank's; rank 1's elastic restart elsewhere
    (a newer launch) takes it, and then rank 3 on a replacement node whose fresh agent
    counts from 0 again. Node
    squat claims rank 2 first and never runs it: its log goes once real2 takes it. No
    finding of the viewer names any of these ranks."""
    copy = tmp_path / "copy"
    collector = CollectorProcess(copy, tmp_path / "collector.out").started()
    address, nodes, peers = collector.address, [], []
    try:
        owner = Node(tmp_path, "owner", [23], address, restart=0)
        nodes.append(owner)
        done = Node(tmp_path, "done", [0, 1, 3], address, restart=0)
        nodes.append(done)
        peers.append(Squatter(address, "squat", [2]))
        until(lambda: min(head_of(ring_path(copy, r)) for r in (0, 1, 2, 23)) >= 0,
              what="the first copies")
        with Running(owner) as running:
            time.sleep(1.0)  # owner's rank runs
            done.stop(exits=DONE)
            forger = Squatter(address, "forger", [23], moving=True,
                              launch={**RUN, "torchelastic_restart_count": "9"})
            peers.append(forger)
            time.sleep(RECONNECT_S + 0.5)  # done has left: its finished ranks may pass
            spare = Node(tmp_path, "spare", [0], address, restart=0)  # the same launch
            nodes.append(spare)
            running.nodes.append(spare)
            # (before any newer launch of the run: then it would pass as a relaunch's)
            collector.wait_for("rank 0 moved from node done to node spare (done: its stream")
            relaunched = Node(tmp_path, "relaunched", [1], address, restart=1)
            real2 = Node(tmp_path, "real2", [2], address)
            nodes += [relaunched, real2]
            running.nodes += [relaunched, real2]
            collector.wait_for("rank 1 moved from node done to node relaunched")
            fresh = Node(tmp_path, "fresh", [3], address, restart=0)
            nodes.append(fresh)
            running.nodes.append(fresh)
            collector.wait_for("rank 23 moved from node forger to node owner (forger: its "
                               "newer launch is its word alone")
            forger.close()
            head = head_of(ring_path(copy, 23))
            collector.wait_for("rank 2 moved from node squat to node real2")
            collector.wait_for("rank 3 moved from node done to node fresh (done: its stream")
            until(lambda: head_of(ring_path(copy, 23)) > head + 3, what="owner's copy")
            time.sleep(UNHEARD_S)  # (the forger's log is quiet, the squatter's never ran)
            running.nodes.remove(relaunched)
            running.nodes.remove(spare)
            time.sleep(0.3)  # (past the runner's step of them)
            relaunched.stop(exits=[{**DONE[1], "pid": 5001}])
            spare.stop(exits=[{**DONE[0], "pid": 6000}])
            until(lambda: _exits(copy)[1] == (5001, 0), what="relaunched's exit code")
            until(lambda: _exits(copy)[0] == (6000, 0), what="spare's exit code")
    finally:
        for n in nodes:
            n.stop()
        for s in peers:
            s.close()
        collector.stop()
    text = collector.text()
    assert "CRASH" not in text and "Traceback" not in text, text
    owners = Owners(copy)  # as a collector started again on the copy reads them
    assert (owners.of[23], owners.base.get(23, 0)) == ("owner", 0)
    # owner's log 0 writes on into its copy; its next log goes past the forger's number
    assert (owners.number(23, 0), owners.number(23, 1)) == (0, 2)
    assert [owners.of[r] for r in range(4)] == ["spare", "relaunched", "real2", "fresh"]
    assert sorted(p.name for p in (copy / "set-aside").iterdir()) == [
        "rank-00002.ring", "rank-00023.1.ring"]
    assert not ring_path(copy, 23, 1).exists() and head_of(ring_path(copy, 2, 1)) > 3
    got = _exits(copy)  # (those of 2 and 23: lost, their nodes end here without theirs)
    assert (got[0], got[1], got[3]) == ((6000, 0), (5001, 0), (4003, 0))
    found = [f for f in json.loads((copy / "findings.json").read_text())["findings"]
             if f["details"].get("reason") == "rank_conflict"]
    assert [(f["ranks"], f["details"]["hosts"]) for f in found] == [([23], ["owner", "forger"])]
    assert "it ran it without a break through node forger's newer launch" in found[0]["summary"]



@pytest.mark.timeout(40)
def test_a_launch_sent_and_left_gives_the_rank_back(tmp_path):
    """Node forger sends a newer launch of rank 23, which node owner runs on, moves it
    for 1.5 s (less than a conflict takes to prove) and leaves: once forger is gone for
    it the rank is owner's again, forger's log out of ranks/ and its lost-node entry out
    of exits.json. On bef3fac the rank stayed forger's for good, its dead log the rank's
    newest in the copy (the viewer: "CRASH ... rank 23 has not been heard from"), while
    owner's frames went on into a copy no reader took for the rank."""
    copy = tmp_path / "copy"
    collector = CollectorProcess(copy, tmp_path / "collector.out").started()
    owner = Node(tmp_path, "owner", [23], collector.address, restart=0)
    try:
        until(lambda: head_of(ring_path(copy, 23)) >= 0, what="owner's copy")
        with Running(owner):
            time.sleep(1.0)  # owner's rank runs
            forger = Squatter(collector.address, "forger", [23], moving=True,
                              launch={**RUN, "torchelastic_restart_count": "9"})
            collector.wait_for("rank 23 moved from node owner to node forger")
            forger.close()  # (NEWS_QUIET_S after the move)
            collector.wait_for("rank 23 moved from node forger to node owner (forger: its "
                               "newer launch is its word alone", timeout_s=10)
            until(lambda: 23 not in _exits(copy), what="forger's lost entry gone")
            head = head_of(ring_path(copy, 23))
            until(lambda: head_of(ring_path(copy, 23)) > head + 3, what="owner's copy")
        owner.stop(exits=[{**DONE[0], "rank": 23, "pid": 4023}])
        # (written by the collector a moment after: stopped at once, it may not be yet)
        until(lambda: _exits(copy).get(23) == (4023, 0), what="owner's exit code")
    finally:
        owner.stop()
        collector.stop()
    text = collector.text()
    assert "CRASH" not in text and "Traceback" not in text and "conflict" not in text, text
    assert Owners(copy).of[23] == "owner" and _exits(copy)[23] == (4023, 0)
    assert [p.name for p in (copy / "set-aside").iterdir()] == ["rank-00023.1.ring"]
    # a peer's word, not the job's: the collector's user's alone (46da595: 0755)
    assert stat.S_IMODE((copy / "set-aside").lstat().st_mode) == 0o700


def test_set_aside_is_private_and_reached_by_no_link(tmp_path):
    """set-aside/ is made 0700; one an older collector made 0755 is made private; a link
    there is not followed (nothing lands where it points: the logs stay in ranks/)."""
    from distdoctor.collect.set_aside import aside_dir

    for run, how in ((tmp_path / "new", None), (tmp_path / "old", "dir"),
                     (tmp_path / "link", "link")):
        run.mkdir()
        if how == "dir":
            (run / "set-aside").mkdir(mode=0o755)
            (run / "set-aside").chmod(0o755)
        elif how == "link":
            (tmp_path / "elsewhere").mkdir()
            (run / "set-aside").symlink_to(tmp_path / "elsewhere")
        aside = aside_dir(run)
        if how == "link":
            assert aside is None and (run / "set-aside").is_symlink()
            continue
        with aside:
            assert stat.S_IMODE(os.fstat(aside.fd).st_mode) == 0o700
    assert not list((tmp_path / "elsewhere").iterdir())



@pytest.mark.timeout(40)
def test_a_collector_started_again_reads_a_given_back_ranks_launch(tmp_path):
    """A copy as a collector left it: rank 23 given back to node owner over node
    forger's log 1 (in set-aside/, owners.jsonl's "jump"), then finished by owner (its
    exit code). Started again on it, the collector reads the launch owner finished from
    owner's newest log, so the job's next elastic restart (shown by two hosts) takes the
    rank at once. On
    bef3fac it read the copy's newest number, forger's log, gone from ranks/: no launch
    known, and the restart's frames were set aside for good ("node owner finished it")."""
    copy = tmp_path / "copy"
    (copy / "ranks").mkdir(parents=True)
    (copy / "set-aside").mkdir()
    for path, count, n in ((ring_path(copy, 23), "0", 0),
                           (copy / "set-aside" / ring_path(copy, 23, 1).name, "9", 1)):
        RingWriter(str(path), 23, 64 * F.SLOT_SIZE, 4096, pid=4023,
                   launch={**RUN, "torchelastic_restart_count": count}, log_number=n).close()
    (copy / "owners.jsonl").write_text(
        '{"host":"owner","ranks":[23]}\n'
        '{"host":"forger","ranks":[23],"base":1,"from":"owner","past":1}\n'
        '{"host":"owner","ranks":[23],"base":0,"from":"forger","past":1,"jump":[1,2]}\n')
    (copy / "exits.json").write_text(json.dumps({"stopped_by_distdoctor": False, "processes": [
        {**DONE[0], "rank": 23, "pid": 4023}]}))
    collector = CollectorProcess(copy, tmp_path / "collector.out").started()
    # (a restart is the run's once two hosts show it: restarts.py)
    peer = Node(tmp_path, "peer", [24], collector.address, restart=1)
    node = None
    try:
        until(lambda: head_of(ring_path(copy, 24)) >= 0, what="peer's copy")
        node = Node(tmp_path, "relaunched", [23], collector.address, restart=1)
        with Running(node, peer):
            collector.wait_for("rank 23 moved from node owner to node relaunched (owner: it "
                               "sends an older launch of the job)", timeout_s=10)
            until(lambda: head_of(ring_path(copy, 23, 2)) > 3, what="relaunched's copy")
    finally:
        for n in (node, peer):
            if n is not None:
                n.stop()
        collector.stop()
    assert "set aside" not in collector.text(), collector.text()


def _pid(path) -> int:
    from distdoctor.runlog.reader import RankLog

    log = RankLog(path)
    try:
        return log.pid
    finally:
        log.close()


def _exits(copy) -> dict[int, tuple]:
    """exits.json of the copy: rank -> (pid, exit code); {} before it is written."""
    if not (copy / "exits.json").exists():
        return {}
    return {p["rank"]: (p["pid"], p["exit_code"])
            for p in json.loads((copy / "exits.json").read_text())["processes"]}



@pytest.mark.timeout(60)
def test_a_peers_log_numbers_cost_a_move_nothing(tmp_path):
    """A rank's move looks at the copies of the rank's logs (which of them never ran),
    whatever their numbers: on bef3fac it looked at every number from the owner's first
    to its newest, and a peer that opened log 65,535 (the wire's highest) of 1,024 ranks
    made their next move hold the collector's loop 6 s (0.34 s for small numbers), longer
    than a rank's silence takes to say it lost, every time a pair of peers hands them
    over. And a rank whose copy starts at log 7 passes with its new owner's logs numbered
    after it: on bef3fac they were numbered from the first number with no file (0), and
    the new owner's log 7 was written over the old owner's copy."""
    copy, n = tmp_path / "copy", 1023  # (and rank 1,023 at log 7: a node's 1,024)
    collector = CollectorProcess(copy, tmp_path / "collector.out").started()
    try:
        first = connect_node(collector.address, "first")
        assert send(first, *[open_log(r) for r in range(n)], open_log(n, log=7, pid=1))
        until(lambda: ring_path(copy, n - 1).exists(), what="first's copies")
        first.close()  # (its ranks pass to the next node to claim them, RECONNECT_S on)
        time.sleep(RECONNECT_S + 0.3)
        second = connect_node(collector.address, "second")
        small = _moved(second, copy, n, log=0, number=1)
        assert send(second, open_log(n, log=7, pid=2))
        until(lambda: ring_path(copy, n, 15).exists(), timeout_s=10, what="second's log 7")
        assert send(second, *[open_log(r, log=65535) for r in range(n)])
        until(lambda: ring_path(copy, n - 1, 65536).exists(), what="second's log 65,535")
        second.close()
        time.sleep(RECONNECT_S + 0.3)
        again = connect_node(collector.address, "first")
        big = _moved(again, copy, n, log=1, number=65538)
        again.close()
    finally:
        collector.stop()
    assert big < 2 * small + 1.0, (small, big)
    assert _pid(ring_path(copy, n, 7)) == 1 and _pid(ring_path(copy, n, 15)) == 2
    assert "Traceback" not in collector.text()


def _moved(sock, copy, n: int, log: int, number: int) -> float:
    """Seconds until the collector has moved `n` ranks to the node on `sock` by its OPEN
    of `log` (each copy numbered `number`)."""
    start = time.monotonic()
    assert send(sock, *[open_log(r, log=log) for r in range(n)])
    until(lambda: ring_path(copy, n - 1, number).exists(), timeout_s=30, what="the move")
    return time.monotonic() - start


@pytest.mark.timeout(40)
def test_a_finished_rank_passes_to_a_rerun_on_a_spare_host_once_its_node_left(tmp_path):
    """Node done runs rank 0 and finishes it (exit 1: the job failed), its stream ends;
    the job is run again on host spare under the same launch identity (static torchrun,
    `run --nproc`: nothing on the wire tells it from a node claiming another's rank). The
    rank passes to spare and spare's exit code is the rank's. On 6f29c8b (bef3fac) spare's
    frames were set aside for good ("only a newer launch of the job takes them"): its whole
    run lost, and exits.json kept the failed run's code. Then, spare gone, host thief
    claims the rank and says it was killed: its word is the rank's entry, and the first
    real exit record (done's exit 1) is kept in exits-earlier.json with the newest it
    replaced (spare's), each with its host. On 46da595 done's entry was gone: the copy
    said only that rank 0 was killed."""
    copy = tmp_path / "copy"
    collector = CollectorProcess(copy, tmp_path / "collector.out").started()
    done = Node(tmp_path, "done", [0], collector.address, restart=0)
    spare = thief = None
    try:
        until(lambda: head_of(ring_path(copy, 0)) >= 0, what="done's copy")
        done.stop(exits=[{**DONE[0], "exit_code": 1}])
        until(lambda: _exits(copy).get(0) == (4000, 1), what="done's exit code")
        time.sleep(RECONNECT_S + 0.5)
        spare = Node(tmp_path, "spare", [0], collector.address, restart=0)
        with Running(spare):
            collector.wait_for("rank 0 moved from node done to node spare (done: its stream",
                               timeout_s=15)
            time.sleep(0.5)
        spare.stop(exits=[{**DONE[0], "pid": 6000}])
        until(lambda: _exits(copy).get(0) == (6000, 0), what="spare's exit code")
        time.sleep(RECONNECT_S + 0.5)
        thief = Node(tmp_path, "thief", [0], collector.address, restart=0)
        with Running(thief):
            collector.wait_for("rank 0 moved from node spare to node thief", timeout_s=15)
            time.sleep(0.5)
        thief.stop(exits=[{**DONE[0], "pid": 7000, "exit_code": None, "signal": "SIGKILL"}])
        until(lambda: _exits(copy).get(0) == (7000, None), what="thief's exit code")
    finally:
        for n in (done, spare, thief):
            if n is not None:
                n.stop()
        collector.stop()
    assert Owners(copy).of[0] == "thief"
    kept = [(p["pid"], p["exit_code"], p["host"], p["replaced_by"])
            for p in json.loads((copy / "exits-earlier.json").read_text())["processes"]]
    assert kept == [(4000, 1, "done", "spare"), (6000, 0, "spare", "thief")]
    # a collector started again on the copy reads them back as they were
    from distdoctor.collect.copy_exits import CopyExits

    again = CopyExits(copy, Owners(copy))
    assert [(p["pid"], p["host"]) for p in again.earlier[0]] == [(4000, "done"), (6000, "spare")]
