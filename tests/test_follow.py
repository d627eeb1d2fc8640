"""The run dir follower on hand-written rings: what the live engine is fed, poll by poll."""

from __future__ import annotations

import json

from distdoctor.runlog import format as F
from distdoctor.runlog.follow import RunFollower
from distdoctor.runlog.ring import RingWriter
from distdoctor.runlog.rundir import rank_meta_path, ring_path


def _writer(run_dir, rank: int, capacity: int = 64) -> RingWriter:
    (run_dir / "ranks").mkdir(exist_ok=True)
    w = RingWriter(str(ring_path(run_dir, rank)), rank, capacity * F.SLOT_SIZE, 4096)
    rank_meta_path(run_dir, rank).write_text(json.dumps({"rank": rank}))
    return w


def _op(w: RingWriter, seq: int) -> int:
    return w.append(F.KIND_COLLECTIVE, F.OP_CODE["all_reduce"], 0, 0, 0, 0, seq, -1, 0, 1,
                    1, 1000 + seq, 0, 0)


def test_a_rank_log_created_later_is_followed_from_its_first_event(tmp_path):
    w0 = _writer(tmp_path, 0)
    w0.complete(_op(w0, 0), F.STATUS_OK, 2000)
    follower = RunFollower(tmp_path)
    assert [(e.rank, e.seq) for e in follower.poll()] == [(0, 0)]
    assert follower.poll() == []  # nothing new
    w1 = _writer(tmp_path, 1)  # a launcher starting ranks one by one
    w1.complete(_op(w1, 0), F.STATUS_OK, 2000)
    w1.complete(_op(w1, 1), F.STATUS_OK, 2001)
    assert [(e.rank, e.seq) for e in follower.poll()] == [(1, 0), (1, 1)]


def test_an_op_seen_in_flight_comes_again_when_it_completes(tmp_path):
    w = _writer(tmp_path, 0)
    follower = RunFollower(tmp_path)
    e = _op(w, 0)
    (first,) = follower.poll()
    assert first.status == "in_flight" and first.t_end_ns is None
    assert follower.poll() == []
    w.complete(e, F.STATUS_OK, 5000)
    (again,) = follower.poll()
    assert (again.index, again.status, again.t_end_ns) == (first.index, "ok", 5000)


def test_a_wrapped_ring_is_read_across_its_end_in_order(tmp_path):
    w = _writer(tmp_path, 0, capacity=16)
    follower = RunFollower(tmp_path)
    for seq in range(10):
        w.complete(_op(w, seq), F.STATUS_OK, 2000 + seq)
    assert [e.seq for e in follower.poll()] == list(range(10))
    for seq in range(10, 30):  # wraps past slot 15, and past what the follower has not read
        w.complete(_op(w, seq), F.STATUS_OK, 2000 + seq)
    assert [e.seq for e in follower.poll()] == list(range(14, 30))  # the ring keeps 16


def test_a_completion_read_half_written_stays_in_flight(tmp_path):
    """complete() writes the status, then t_end; a reader between the two stores must
    not take the op as finished with status "in_flight"."""
    w = _writer(tmp_path, 0)
    follower = RunFollower(tmp_path)
    e = _op(w, 0)
    follower.poll()
    at = w.ring_offset + e * F.SLOT_SIZE
    F.I64.pack_into(w._mm, at + F.OFF_SLOT_END, 5000)  # t_end landed, status not yet seen
    assert follower.poll() == []
    w.complete(e, F.STATUS_OK, 5000)
    (done,) = follower.poll()
    assert (done.status, done.t_end_ns) == ("ok", 5000)


def test_a_slot_not_readable_yet_is_waited_for_then_skipped_as_corrupt(tmp_path):
    """A slot whose event number does not match (being written, or corrupt) stops the
    read there: the events after it come once it reads, or, still unreadable at the
    third poll, past it (skipped), in order."""
    w = _writer(tmp_path, 0)
    for seq in range(6):
        w.complete(_op(w, seq), F.STATUS_OK, 2000 + seq)
    word = slice(w.ring_offset + 2 * F.SLOT_SIZE, w.ring_offset + 2 * F.SLOT_SIZE + 8)
    good = bytes(w._mm[word])
    w._mm[word] = (99).to_bytes(8, "little")
    follower = RunFollower(tmp_path)
    assert [e.seq for e in follower.poll()] == [0, 1]
    assert follower.poll() == []  # waited for
    w._mm[word] = good  # written since: read, and what follows it
    assert [e.seq for e in follower.poll()] == [2, 3, 4, 5]
    for seq in range(6, 12):
        w.complete(_op(w, seq), F.STATUS_OK, 2000 + seq)
    word = slice(w.ring_offset + 8 * F.SLOT_SIZE, w.ring_offset + 8 * F.SLOT_SIZE + 8)
    w._mm[word] = (99).to_bytes(8, "little")
    assert [e.seq for e in follower.poll()] == [6, 7]
    assert follower.poll() == []
    assert [e.seq for e in follower.poll()] == [9, 10, 11]  # the third look: skipped


def test_missing_rank_metadata_is_retried_soon_then_less_often(tmp_path, monkeypatch):
    w = _writer(tmp_path, 0)
    rank_meta_path(tmp_path, 0).unlink()  # the rank has not written it yet
    clock = [100.0]
    monkeypatch.setattr("distdoctor.runlog.follow.time.monotonic", lambda: clock[0])
    follower = RunFollower(tmp_path)
    w.complete(_op(w, 0), F.STATUS_OK, 2000)
    tried_at = []
    real_load = follower._load_meta

    def counting_load(rank, now_too=False):
        before = follower._meta_tried.get(rank)
        real_load(rank, now_too)
        if follower._meta_tried.get(rank) != before:
            tried_at.append(clock[0] - 100.0)

    monkeypatch.setattr(follower, "_load_meta", counting_load)
    for _ in range(64):  # 8 s of polls every 1/8 s, the file never written
        follower.poll()
        clock[0] += 0.125
    gaps = [b - a for a, b in zip(tried_at, tried_at[1:], strict=False)]
    assert gaps[:4] == [0.25, 0.5, 1.0, 2.0] and set(gaps[4:]) == {2.0}, gaps
    rank_meta_path(tmp_path, 0).write_text(json.dumps({"rank": 0, "host": "h", "pid": 7}))
    follower.poll()
    assert follower.meta[(0, 0)] == {}  # tried a moment ago
    follower.poll(final=True)  # the last poll of a run looks once more
    assert follower.meta[(0, 0)]["pid"] == 7


def test_a_backlog_starts_a_long_log_near_its_end(tmp_path):
    w = _writer(tmp_path, 0)
    for seq in range(10):
        w.complete(_op(w, seq), F.STATUS_OK, 2000 + seq)
    assert [e.seq for e in RunFollower(tmp_path, backlog=3).poll()] == [7, 8, 9]
    assert [e.seq for e in RunFollower(tmp_path, backlog=0).poll()] == []


def test_a_rank_dead_before_its_metadata_was_read_is_found_dead_by_the_last_pass(tmp_path):
    """The live engine tells a dead local rank by its pid, from the rank's metadata. A
    rank that wrote its metadata just after the follower first looked, and died before
    the next look, must still be found dead when the run ends a moment later."""
    import socket
    import subprocess

    from distdoctor.diagnosis.live import LiveDiagnosis

    w = _writer(tmp_path, 0)
    rank_meta_path(tmp_path, 0).unlink()
    w.complete(_op(w, 0), F.STATUS_OK, 2000)
    _op(w, 1)  # it died inside its next collective
    live = LiveDiagnosis(tmp_path, hang_timeout_s=60)
    live.pass_once()  # looked for the metadata: not there yet
    gone = subprocess.Popen(["true"])
    gone.wait()
    rank_meta_path(tmp_path, 0).write_text(json.dumps(
        {"rank": 0, "host": socket.gethostname(), "pid": gone.pid}))
    crashes = [f for f in live.stop() if f.kind == "crash"]
    assert [(f.ranks, f.details["how"]) for f in crashes] == [([0], "vanished")]


def test_a_remote_rank_taken_for_dead_comes_back_when_its_heartbeat_does(tmp_path):
    """A node's link to the collector (or a shared file system) stalls for longer than
    the stale-heartbeat limit: its ranks look dead, and are alive again once it is back."""
    from distdoctor.diagnosis.live import LiveDiagnosis
    from distdoctor.diagnosis.live_ranks import STALE_HEARTBEAT_S

    w = _writer(tmp_path, 0)
    rank_meta_path(tmp_path, 0).write_text(json.dumps(
        {"rank": 0, "host": "another-node", "pid": 1}))
    w.complete(_op(w, 0), F.STATUS_OK, 2000)
    live = LiveDiagnosis(tmp_path, hang_timeout_s=60, owner=False)
    live._step(100.0)
    live._step(100.0 + STALE_HEARTBEAT_S + 1)
    (f,) = live.engine.findings()
    # from here a rank on another host cannot be told dead from cut off: never "died"
    assert f.kind == "crash" and f.details["how"] == "unheard", f.summary
    assert "has not been heard from" in f.summary and "died (" not in f.summary
    w.heartbeat()  # the node is back
    live._step(100.0 + STALE_HEARTBEAT_S + 2)
    assert live.engine.findings() == [] and live.engine.ranks[0].exit is None
    live.close()


def test_a_polls_logs_are_interleaved_in_turns_each_in_its_own_order():
    """A poll's batch takes each log's new events in turns (runlog.interleave), so a
    collective's rendezvous closes within a turn of opening, not once every log before
    the last rank's has been read whole; each log's events stay in their order."""
    from distdoctor.runlog.interleave import INTERLEAVE, interleaved

    a = [("a", i) for i in range(3 * INTERLEAVE)]
    b = [("b", i) for i in range(3 * INTERLEAVE // 2)]
    c = [("c", 0)]
    out = interleaved([a, b, c])
    assert sorted(out) == sorted(a + b + c)
    for log in (a, b, c):
        assert [ev for ev in out if ev[0] == log[0][0]] == log
    # three turns: the busiest log a third at a time, the others by the same share
    assert out[:INTERLEAVE] == a[:INTERLEAVE] and out[INTERLEAVE][0] == "b"
    assert out.index(("b", INTERLEAVE // 2)) > out.index(("a", INTERLEAVE))
    assert interleaved([a[:5], b[:5]]) == a[:5] + b[:5]  # one turn: each whole
