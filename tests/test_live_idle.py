"""`run`'s live diagnosis follows the job at the job's pace: a pass in which nothing
changed stops after reading the rank logs' headers, and the time-driven checks (liveness,
progress, the detectors' clocks) run at their own slower cadence. Hand-written rings of a
real log format, passes driven with chosen clocks."""

from __future__ import annotations

import json
import os
import socket

from distdoctor.diagnosis import live_ranks
from distdoctor.diagnosis.live import POLL_S, LiveDiagnosis
from distdoctor.runlog import format as F
from distdoctor.runlog.pace import SLOW_S
from distdoctor.runlog.ring import RingWriter
from distdoctor.runlog.rundir import rank_meta_path, ring_path


def _writer(run_dir, rank: int) -> RingWriter:
    (run_dir / "ranks").mkdir(exist_ok=True)
    w = RingWriter(str(ring_path(run_dir, rank)), rank, 64 * F.SLOT_SIZE, 4096)
    rank_meta_path(run_dir, rank).write_text(json.dumps(
        {"rank": rank, "host": socket.gethostname(), "pid": os.getpid()}))
    return w


def _op(w: RingWriter, seq: int) -> int:
    return w.append(F.KIND_COLLECTIVE, F.OP_CODE["all_reduce"], 0, 0, 0, 0, seq, -1, 0, 1,
                    1, 1000 + seq, 0, 0)


class _Counted:
    """Counts the engine's detector passes and the liveness reads of the ranks' pids."""

    def __init__(self, live: LiveDiagnosis, monkeypatch):
        self.ticks = self.pid_reads = 0
        engine = live.engine
        tick, pid_alive = engine.tick, live_ranks.pid_alive

        def counted_tick(*a, **k):
            self.ticks += 1
            return tick(*a, **k)

        def counted_pid_alive(pid):
            self.pid_reads += 1
            return pid_alive(pid)

        monkeypatch.setattr(engine, "tick", counted_tick)
        monkeypatch.setattr(live_ranks, "pid_alive", counted_pid_alive)


def test_an_idle_job_costs_a_header_read_per_pass_and_checks_liveness_on_its_own_clock(
        tmp_path, monkeypatch):
    ranks = [_writer(tmp_path, r) for r in range(2)]
    for w in ranks:
        w.complete(_op(w, 0), F.STATUS_OK, 2000)
    live = LiveDiagnosis(tmp_path, hang_timeout_s=60, owner=False)
    live._step(100.0)  # the first pass reads everything
    counted = _Counted(live, monkeypatch)
    passes = 8
    for i in range(1, passes + 1):  # polls within one slow period: only samples written
        for w in ranks:  # the main thread's sampler writes these whatever the job does
            e = w.append(F.KIND_SAMPLE, F.OP_CODE["sample"], F.REDOP_NONE, 0, 0, 0, 0, -1,
                         0, 0, 0, 5000 + i, 0, 0)
            w.complete(e, F.STATUS_OK, 5000 + i)
        live._step(100.0 + i * SLOW_S / (passes + 1))
    assert live.follower.poll() == []  # the samples were taken in, not left behind
    assert (counted.ticks, counted.pid_reads) == (0, 0)
    live._step(100.0 + SLOW_S)  # the slow checks' turn: each rank's pid, the detectors
    assert (counted.ticks, counted.pid_reads) == (1, 2)
    live.close()


def test_what_changed_is_judged_at_once_between_slow_checks(tmp_path, monkeypatch):
    """New events reach the detectors on the next pass (a mismatch is not held for the
    slow cadence), and a log closed by its rank is seen as the rank's exit at once."""
    w0, w1 = _writer(tmp_path, 0), _writer(tmp_path, 1)
    for w in (w0, w1):
        w.complete(_op(w, 0), F.STATUS_OK, 2000)
    live = LiveDiagnosis(tmp_path, hang_timeout_s=60, owner=False)
    live._step(100.0)
    counted = _Counted(live, monkeypatch)
    w0.complete(_op(w0, 1), F.STATUS_OK, 3000)
    live._step(100.1)
    assert counted.ticks == 1 and max(live.engine.ranks[0].issued.values()) == 2
    live._step(100.2)
    assert counted.ticks == 1  # nothing new since
    w1.mark_closed()  # the rank shut down
    live._step(100.3)
    assert counted.ticks == 2 and live.engine.ranks[1].exit is not None
    assert live.engine.ranks[0].exit is None
    live.close()


def test_the_loop_looks_at_the_slow_checks_cadence_idle_or_busy(tmp_path, monkeypatch):
    """The loop's own cadence: a look at the logs every POLL_S, the time-driven checks'
    own (twice a second), whether the job is idle or brings events at every look; each
    look that comes runs the time-driven checks (none wasted on a header read alone)."""
    import time

    ranks = [_writer(tmp_path, r) for r in range(2)]
    for w in ranks:
        w.complete(_op(w, 0), F.STATUS_OK, 2000)
    live = LiveDiagnosis(tmp_path, hang_timeout_s=60, owner=False)
    passes, plans = [], []
    step, plan = live._step, live.follower.plan
    monkeypatch.setattr(live, "_step", lambda now_s, **k: (passes.append(now_s),
                                                           step(now_s, **k)))
    monkeypatch.setattr(live.follower, "plan", lambda *a: plans.append(plan(*a)) or plans[-1])
    live.start()
    time.sleep(3.1)
    idle = len(passes)
    seq = 1
    while len(passes) < idle + 8:  # now events on every look
        for w in ranks:
            w.complete(_op(w, seq), F.STATUS_OK, 2000 + seq)
        seq += 1
        time.sleep(0.02)
    live.leave()
    assert POLL_S == SLOW_S
    assert 2 <= idle <= 7, passes  # ~2 a second
    gaps = sorted(b - a for a, b in zip(passes[idle:-1], passes[idle + 1:], strict=True))
    assert POLL_S * 0.95 <= gaps[len(gaps) // 2] < 2 * POLL_S, gaps
    assert len(plans) == len(passes) and plans.count(True) >= len(plans) - 1, plans
    assert live.engine.ranks[0].latest.seq >= seq - 2  # and every look read the new ones
