"""A collector started again on its own run dir picks the nodes up where they were (issue
46, item 4): `watch --listen` on a copy a collector made takes it back with one line (any
other run dir is still refused), a node's log copy goes on in the same file (a reader of
it keeps its place), and the exit codes and rank owners already there are kept."""

from __future__ import annotations

import json
import os
import time

import pytest
from conftest import run_cli
from simnode import CollectorProcess, connect_node, exits, head_of, meta, send, until

from distdoctor.collect import wire
from distdoctor.runlog import format as F
from distdoctor.runlog.reader import RankLog
from distdoctor.runlog.ring import RingWriter
from distdoctor.runlog.rundir import ring_path, write_run_meta


def _append(w: RingWriter, seqs) -> None:
    for seq in seqs:
        e = w.append(F.KIND_COLLECTIVE, F.OP_CODE["all_reduce"], 0, 0, 0, 0, seq, -1, 0, 1,
                     1, 1000 + seq, 0, 0)
        w.complete(e, F.STATUS_OK, 2000 + seq)


def _log_frames(node_log: str, first: int, upto: int) -> list[bytes]:
    """OPEN, STRINGS, SLOTS of events first..upto-1 and STATE, read from a node's log as
    its forwarder reads it."""
    log = RankLog(node_log)
    used = log.word(F.OFF_STRINGS_USED)
    frames = [wire.frame(wire.OPEN, wire.OPEN_BODY.pack(log.capacity, log.strings_size,
                                                        log.pid), 0)]
    if used:
        frames.append(wire.frame(wire.STRINGS, log.raw_strings(0, used), 0, 0))
    frames.append(wire.frame(wire.SLOTS, b"".join(log.raw_slot(e) for e in range(first, upto)),
                             0, first))
    frames.append(wire.frame(wire.STATE, wire.STATE_BODY.pack(
        upto, used, log.word(F.OFF_STRINGS_COUNT), 0, time.monotonic_ns(), time.time_ns(),
        0, 0, 0), 0))
    log.close()
    return frames


@pytest.mark.timeout(60)
def test_a_collector_started_again_on_its_copy_picks_the_node_up(tmp_path):
    node_dir, copy = tmp_path / "node", tmp_path / "copy"
    (node_dir / "ranks").mkdir(parents=True)
    w = RingWriter(str(ring_path(node_dir, 0)), 0, 64 * F.SLOT_SIZE, 4096)
    _append(w, range(10))
    first = CollectorProcess(copy, tmp_path / "first.out").started()
    try:
        node = connect_node(first.address, "node")
        assert send(node, meta(0, "node"), *_log_frames(str(ring_path(node_dir, 0)), 0, 10))
        other = connect_node(first.address, "other")
        assert send(other, meta(7, "other"), exits([{"rank": 7, "pid": 9, "exit_code": 3,
                                                      "signal": None,
                                                      "stopped_by_distdoctor": False}]))
        until(lambda: head_of(ring_path(copy, 0)) == 10 and (copy / "exits.json").exists(),
              what="the first collector's copy")
        node.close()
        other.close()
    finally:
        assert first.stop() == 0
    inode = os.stat(ring_path(copy, 0)).st_ino
    reader = RankLog(ring_path(copy, 0))  # a reader of the copy, across the restart
    run = tmp_path / "run"  # a run dir no collector made is still refused
    write_run_meta(run, launcher="distdoctor run", command=["distdoctor", "run"])
    done = run_cli(["watch", "--listen", "127.0.0.1:0", str(run)], timeout=30)
    assert done.returncode != 0 and "already holds a run" in done.stderr, done.stderr
    assert [e.seq for e in reader.read(0)] == list(range(10))

    second = CollectorProcess(copy, tmp_path / "second.out",
                              port=first.port).started()
    try:
        assert "a collector's copy already" in second.text()
        _append(w, range(10, 15))
        node = connect_node(second.address, "node")
        assert send(node, meta(0, "node"), *_log_frames(str(ring_path(node_dir, 0)), 10, 15),
                    exits([{"rank": 0, "pid": 5, "exit_code": 0, "signal": None,
                            "stopped_by_distdoctor": False}]))
        until(lambda: head_of(ring_path(copy, 0)) == 15, what="the copy going on")
        assert os.stat(ring_path(copy, 0)).st_ino == inode  # the same file, written on
        assert [e.seq for e in reader.read(10)] == list(range(10, 15))
        until(lambda: len(json.loads((copy / "exits.json").read_text())["processes"]) == 2,
              what="both nodes' exits")
        codes = {p["rank"]: p["exit_code"]
                 for p in json.loads((copy / "exits.json").read_text())["processes"]}
        assert codes == {0: 0, 7: 3}
        meta0 = (copy / "ranks" / "rank-00000.json").read_bytes()
        thief = connect_node(second.address, "thief")  # the owners are kept too
        send(thief, meta(0, "thief"))
        second.wait_for("node thief sends rank 0 of node node: its frames for it are set "
                        "aside")
        assert (copy / "ranks" / "rank-00000.json").read_bytes() == meta0
        thief.close()
        node.close()
        assert "Traceback" not in second.text()
    finally:
        reader.close()
        w.close()
        second.stop()
