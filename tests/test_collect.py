"""Multi-node collection: `distdoctor run --forward` on each node, `watch --listen` on the
head node. Two "nodes" here are two torchrun launches (node ranks 0 and 1) on this host,
each under its own `distdoctor run` with its own run dir; only the collector sees all."""

from __future__ import annotations

import json
import socket
import sys
import time
from pathlib import Path

import pytest
from conftest import JOBS, Lines, _kill_ranks, marker_lines, run_cli
from conftest import start_cli as _start
from conftest import stop_process as _stop

from distdoctor.collect import wire
from distdoctor.collect.forward import Forwarder
from distdoctor.collect.server import Collector, listen
from distdoctor.launch.env import free_port
from distdoctor.runlog import format as F
from distdoctor.runlog.follow import RunFollower
from distdoctor.runlog.reader import RankLog
from distdoctor.runlog.ring import RingWriter
from distdoctor.runlog.rundir import rank_meta_path, ring_path

BUGS = JOBS / "bugs"


@pytest.mark.timeout(150)
def test_the_collector_sees_every_node_and_names_the_rank_on_the_other_node(tmp_path):
    """Rank 3 (node 1) spins outside any collective; ranks 0-2 wait in all_reduce. Node 0's
    own engine cannot see rank 3; the collector, fed by both nodes, names it."""
    port, master = free_port(), free_port()
    copy = tmp_path / "copy"
    collector = _start(["watch", "--listen", f"127.0.0.1:{port}", str(copy),
                        "--hang-timeout", "5"])
    said = Lines(collector)
    nodes, node_dirs = [], []
    try:
        said.wait_for("collecting on", 30)
        for node_rank in (0, 1):
            run_dir = tmp_path / f"node{node_rank}"
            node_dirs.append(run_dir)
            nodes.append(_start([
                "run", "--run-dir", str(run_dir), "--forward", f"127.0.0.1:{port}",
                "--hang-timeout", "30", "--", sys.executable, "-m", "torch.distributed.run",
                "--nnodes", "2", "--node-rank", str(node_rank), "--nproc-per-node", "2",
                "--master-addr", "127.0.0.1", "--master-port", str(master),
                str(BUGS / "stuck_outside.py")]))
        line = said.wait_for("HANG", 90)
        assert "rank 3 never joined" in line, line
        # each node's own run dir holds only its own ranks
        assert sorted(p.name for p in (node_dirs[1] / "ranks").glob("*.ring")) == [
            "rank-00002.ring", "rank-00003.ring"]
    finally:
        for proc in nodes:
            _stop(proc)
        for run_dir in node_dirs:
            _kill_ranks(run_dir)
        code = _stop(collector)
    assert code == 0, "".join(said.lines)
    said.wait_for("collected", 10)
    # the copy is a run dir like any other: all four ranks, and the same diagnosis after
    assert sorted(p.name for p in (copy / "ranks").glob("*.ring")) == [
        f"rank-{r:05d}.ring" for r in range(4)]
    post = run_cli(["diagnose", str(copy), "--json", "--hang-timeout", "5"], timeout=60)
    hangs = [f for f in json.loads(post.stdout)["findings"] if f["kind"] == "hang"]
    assert [h["ranks"] for h in hangs] == [[3]], post.stdout
    culprit = hangs[0]["callsites"][0]  # the line of rank 3's last collective
    assert (culprit["rank"], culprit["line"]) == (3, marker_lines("bugs/stuck_outside.py")[
        "others"]) and culprit["file"].endswith("stuck_outside.py")
    assert "Traceback" not in "".join(said.lines)


@pytest.mark.timeout(60)
def test_a_job_whose_collector_is_down_runs_as_without_one(tmp_path):
    closed = free_port()  # nobody listens there
    proc = run_cli(["run", "--nproc", "2", "--run-dir", str(tmp_path / "run"), "--forward",
                    f"127.0.0.1:{closed}", "--", str(JOBS / "all_ops.py")],
                   timeout=50, run_dir=tmp_path / "run")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("cannot reach the collector") == 1, proc.stderr
    assert "Traceback" not in proc.stderr and "no findings" in proc.stderr


# --- the collector against bad peers, in process ---------------------------------------

def _ring_with_events(run_dir: Path, n: int) -> RingWriter:
    (run_dir / "ranks").mkdir(parents=True)
    w = RingWriter(str(ring_path(run_dir, 0)), 0, 64 * F.SLOT_SIZE, 4096)
    rank_meta_path(run_dir, 0).write_text(json.dumps({"rank": 0, "host": "x", "pid": 1}))
    for seq in range(n):
        e = w.append(F.KIND_COLLECTIVE, F.OP_CODE["all_reduce"], 0, 0, 0, 0, seq, -1, 0, 1,
                     1, 1000 + seq, 0, 0)
        w.complete(e, F.STATUS_OK, 2000 + seq)
    return w


def _collector(tmp_path, token=None, port=0) -> tuple[Collector, list[str]]:
    said: list[str] = []
    return Collector(tmp_path / "copy", listen(("127.0.0.1", port)), token,
                     said.append).start(), said


def _until(predicate, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.mark.timeout(30)
def test_a_malformed_frame_drops_its_node_and_keeps_what_it_sent(tmp_path):
    _ring_with_events(tmp_path / "node", 10)
    collector, said = _collector(tmp_path)
    try:
        fwd = Forwarder(tmp_path / "node", collector.address)
        fwd.tick()
        fwd.stop()
        _until(lambda: len(RunFollower(tmp_path / "copy").poll()) == 10)
        for bad, why in [
                (b"GET / HTTP/1.1\r\n\r\n" + bytes(8), "not a distdoctor forwarding stream"),
                (wire.json_frame(wire.META, {"rank": 0}), "first frame is not HELLO"),
                (wire.json_frame(wire.HELLO, {"format": wire.FORMAT, "host": "h"})
                 + wire.frame(wire.SLOTS, b"x" * 100, 0, 0), "before OPEN"),
                (wire.json_frame(wire.HELLO, {"format": wire.FORMAT, "host": "../etc"}),
                 "no usable host"),
                (wire.json_frame(wire.HELLO, {"format": wire.FORMAT, "host": "h"})
                 + wire.FRAME.pack(wire.MAGIC, 1, wire.SAMPLES, 0, 0, 0, 1 << 30),
                 "at most"),
                (wire.FRAME.pack(wire.MAGIC, 1, wire.HELLO, 0, 0, 0, 1 << 20), "at most")]:
            with socket.create_connection(collector.address) as s:
                s.sendall(bad)
                _until(lambda why=why: any(why in line for line in said))
        assert all("Traceback" not in line for line in said)
        assert len(RunFollower(tmp_path / "copy").poll()) == 10  # nothing lost
    finally:
        collector.stop()


@pytest.mark.timeout(30)
def test_how_a_rank_left_reaches_the_copy(tmp_path):
    """An os._exit status and an uncaught exception cross the wire: the copy's reader tells
    the rank that left with 3 and the one that raised, as the node's own reader does."""
    exited = _ring_with_events(tmp_path / "node", 2)
    raised = RingWriter(str(ring_path(tmp_path / "node", 1)), 1, 64 * F.SLOT_SIZE, 4096)
    rank_meta_path(tmp_path / "node", 1).write_text(json.dumps({"rank": 1, "host": "x",
                                                                "pid": 2}))
    exited.mark_exited(3)
    raised.mark_closed(raised.add_string({"type": "ValueError", "message": "bad batch",
                                          "file": "train.py", "line": 7}))
    collector, _ = _collector(tmp_path)
    try:
        fwd = Forwarder(tmp_path / "node", collector.address)
        fwd.tick()
        fwd.stop()
        run = tmp_path / "copy"
        _until(lambda: all(ring_path(run, r).exists() for r in (0, 1))
               and RankLog(ring_path(run, 0)).header().closed
               and RankLog(ring_path(run, 1)).header().closed)
        left = RankLog(ring_path(run, 0)).header()
        assert (left.exit_code, left.exception) == (3, None)
        died = RankLog(ring_path(run, 1)).header()
        assert died.exit_code is None and died.exception["message"] == "bad batch"
    finally:
        collector.stop()


@pytest.mark.timeout(30)
def test_a_collector_with_a_token_refuses_a_node_without_it_and_the_node_backs_off(
        tmp_path, capsys):
    _ring_with_events(tmp_path / "node", 3)
    collector, said = _collector(tmp_path, token="s3cret")
    try:
        wrong = Forwarder(tmp_path / "node", collector.address, token="wrong")
        for _ in range(5):  # the job's forwarder ticks 4 times a second
            wrong.tick()
        _until(lambda: any("wrong or missing token" in line for line in said))
        assert sum("wrong or missing token" in line for line in said) == 1  # backed off
        for _ in range(3):
            wrong.tick(final=True)  # tried regardless of the back-off: still one line
        wrong.stop()
        err = capsys.readouterr().err
        assert err.count("refused this node: wrong or missing token") == 1, err
        assert wrong._next_try_s - time.monotonic() > 20  # it waits before trying again
        assert not list((tmp_path / "copy" / "ranks").glob("*.ring"))
        right = Forwarder(tmp_path / "node", collector.address, token="s3cret")
        right.tick()
        right.stop()
        _until(lambda: len(RunFollower(tmp_path / "copy").poll()) == 3)
    finally:
        collector.stop()


@pytest.mark.timeout(60)
def test_a_node_reconnects_after_its_link_drops_and_the_copy_catches_up(tmp_path):
    """Events written while the link was down, and the completion of an op that was in
    flight when it went, reach the copy after the reconnection; a reader of the copy
    keeps its place."""
    w = _ring_with_events(tmp_path / "node", 5)
    pending = w.append(F.KIND_COLLECTIVE, F.OP_CODE["all_reduce"], 0, 0, 0, 0, 5, -1, 0, 1,
                       1, 1005, 0, 0)
    collector, said = _collector(tmp_path)
    fwd = Forwarder(tmp_path / "node", collector.address).start()
    try:
        follower = RunFollower(tmp_path / "copy")
        seen: list = []
        _until(lambda: seen.extend(follower.poll()) or len(seen) == 6)
        assert seen[-1].status == "in_flight"
        with collector._lock:  # the link drops (a switch reboots)
            for conn in collector._conns:
                conn.shutdown(socket.SHUT_RDWR)
        w.complete(pending, F.STATUS_OK, 3000)
        for seq in range(6, 9):
            w.complete(w.append(F.KIND_COLLECTIVE, F.OP_CODE["all_reduce"], 0, 0, 0, 0, seq,
                                -1, 0, 1, 1, 1000 + seq, 0, 0), F.STATUS_OK, 2000 + seq)
        _until(lambda: seen.extend(follower.poll()) or len(seen) >= 10, timeout_s=30)
        done = {e.seq: e.status for e in seen if e.t_end_ns}
        assert done == {seq: "ok" for seq in range(9)}, done
        assert sum("connected" in line for line in said) == 2, said
    finally:
        fwd.stop()
        collector.stop()


@pytest.mark.timeout(30)
def test_the_errors_a_node_read_in_its_job_output_reach_the_copy_and_nothing_else(tmp_path):
    """A node's `run` alone sees its job's output (an NCCL error line); its own hang
    findings come from a partial view of the ranks and stay on the node."""
    from distdoctor.findings import Finding, read_findings, write_findings

    _ring_with_events(tmp_path / "node", 3)
    nccl = Finding("comm_error", "error", "NCCL error: unhandled system error", [],
                   details={"source": "log", "signature": "nccl/system"})
    partial = Finding("hang", "error", "hang: ranks 0, 1 never joined all_reduce #2", [0, 1])
    write_findings(tmp_path / "node", [nccl, partial])
    told: list = []
    collector = Collector(tmp_path / "copy", listen(("127.0.0.1", 0)), None, print,
                          on_finding=told.append).start()
    try:
        fwd = Forwarder(tmp_path / "node", collector.address)
        fwd.tick()
        fwd.tick()  # unchanged: not sent, nor told, again
        fwd.stop()
        _until(lambda: (tmp_path / "copy" / "findings.json").exists())
        assert [f.summary for f in read_findings(tmp_path / "copy")] == [nccl.summary]
        assert [f.summary for f in told] == [nccl.summary]
    finally:
        collector.stop()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("args, message", [
    (["watch", "--listen", "10.1.2.3:7070"], "needs a shared token"),
    (["watch", "--listen", "nonsense"], "expected HOST:PORT"),
    (["watch", "--listen", "127.0.0.1:7070", "--once"], "--once reads a run dir"),
    (["run", "--forward", "host:port", "--nproc", "1", "--", "x.py"], "expected HOST:PORT"),
])
def test_bad_collection_flags_get_one_line(args, message, tmp_path):
    proc = run_cli(args, timeout=30, cwd=tmp_path)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
