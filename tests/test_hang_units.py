"""The progress rule (diagnosis/hangs/progress.py) and the collector's judgement of late nodes
(collect/fleet.py, collect/reports.py), on readings and digests built by hand; the real
jobs are in test_hang_auto.py."""

from __future__ import annotations

import os

from distdoctor.probes.progress import Reading, read_progress

from distdoctor.collect.fleet import FleetEngine
from distdoctor.diagnosis.hangs.progress import SPIN_S, STALL_S, Policy, ProgressTracker
from distdoctor.runlog.reader import Event


def _tracker(seconds: float, cpu: float = 0.0, io_bps: float = 0.0, helpers: float = 0.0):
    """A rank read twice a second for `seconds`, using `cpu` of a core on its main
    thread, `helpers` on its other threads, and doing `io_bps` of I/O."""
    t = ProgressTracker()
    for k in range(int(seconds * 2) + 1):
        s = k / 2
        t.add(0, Reading(100 + s, cpu * s, 0.0, (cpu + helpers) * s, int(io_bps * s), "S"))
    return t


def test_an_idle_rank_is_a_hang_once_stalled_and_a_busy_one_a_long_wait():
    auto = Policy()
    idle = _tracker(STALL_S + 1).progress(0)
    assert not idle.busy and idle.idle_s >= STALL_S
    assert auto.judge(STALL_S + 1, idle, None, False, None).state == "hang"
    assert auto.judge(STALL_S - 1, idle, None, False, None).state == "pending"
    # waiting for its DataLoader: a long wait, however idle its workers look
    assert auto.judge(STALL_S + 1, idle, None, True, None).state == "long_wait"
    busy = _tracker(60, cpu=0.9).progress(0)
    assert busy.busy and auto.judge(600, busy, 1.0, False, None).state == "long_wait"
    writing = _tracker(60, cpu=0.05, io_bps=50e6).progress(0)
    assert writing.busy and "MB/s" in writing.evidence
    # the fixed override ignores progress
    assert Policy(30).judge(31, busy, None, False, None).state == "hang"


def test_a_busy_rank_on_one_line_is_a_hang_only_alone_and_past_the_bound():
    auto = Policy()
    spinning = _tracker(SPIN_S + 2, cpu=1.0).progress(0)
    verdict = auto.judge(SPIN_S + 2, spinning, SPIN_S + 1, False, None)
    assert verdict.state == "hang" and verdict.spin
    # its other threads work too (torch's intra-op pool): a computation, not a loop
    helped = _tracker(SPIN_S + 2, cpu=1.0, helpers=0.8).progress(0)
    assert auto.judge(SPIN_S + 2, helped, SPIN_S + 1, False, None).state == "long_wait"
    # a long wait outlasting what this call site has shown normal escalates
    assert auto.judge(3000, spinning, 0.5, False, 900.0).state == "long_wait"
    assert auto.judge(4000, spinning, 0.5, False, 100.0).state == "hang"


def test_the_reader_sees_a_process_burn_cpu():
    first = read_progress(os.getpid())
    end = first.t + 0.3
    import time

    while time.monotonic() < end:
        pass
    second = read_progress(os.getpid())
    # it ran, or waited for a CPU to run on (a loaded machine)
    wanted = (second.cpu_s + second.runq_s) - (first.cpu_s + first.runq_s)
    assert wanted > 0.2 and second.tree_cpu_s >= second.cpu_s - 0.05
    assert read_progress(2 ** 22 + 12345) is None  # no such process


def _op(rank: int, seq: int, done: bool, t: int) -> Event:
    return Event(rank=rank, index=seq, kind="collective", op="all_reduce",
                 status="ok" if done else "in_flight", group="0", group_desc="default_pg",
                 group_ranks=(0, 1, 2, 3), seq=seq, peer=None, shapes=((64,),),
                 dtypes=("float32",), device="cpu", numel_in=64, numel_out=64,
                 reduce_op="sum", callsite={"file": "/job/t.py", "line": 9, "function": "f"},
                 t_enter_ns=t, t_end_ns=t + 1000 if done else None, span_index=0, name=None,
                 error=None, is_async=False, other_thread=False)


def _digest(host: str, positions: list, progress: dict) -> dict:
    from distdoctor.collect.digest import event_row

    ranks = []
    for rank, latest, last, now_ns in positions:
        ranks.append([rank, event_row(latest), event_row(last), {"0": latest.seq + 1}, now_ns,
                      None, False, {"progress": progress.get(rank)}])
    return {"host": host, "groups": {"0": ["default_pg", [0, 1, 2, 3]]}, "sigs": {},
            "arrivals": [], "ranks": ranks}


def test_a_late_node_is_a_state_and_its_ranks_are_judged_when_it_reports_again():
    """Node a (ranks 0-1) waits in all_reduce #5 for node b (ranks 2-3). b's reports stop
    for 12 s: no hang (it is b that is late, not its ranks that hung), one host finding
    once b reports again. Then b says rank 3 is idle outside any collective: one hang,
    naming rank 3; rank 2 (busy, then in the collective) is never named."""
    fleet = FleetEngine()  # by progress
    s = 1_000_000_000
    busy = [True, 0.0, None, "busy: 97% CPU", 0.2, False]

    def node_a(now):
        fleet.apply(_digest("a", [(r, _op(r, 5, False, 10 * s), _op(r, 4, True, 9 * s),
                                   int(now * s)) for r in (0, 1)], {}), now_s=now)

    def node_b(now, rank3):
        fleet.apply(_digest("b", [(2, _op(2, 4, True, 9 * s), _op(2, 4, True, 9 * s),
                                   int(now * s)),
                                  (3, _op(3, 4, True, 9 * s), _op(3, 4, True, 9 * s),
                                   int(now * s))], {2: busy, 3: rank3}), now_s=now)

    for k in range(10, 13):
        node_a(k)
        node_b(k, busy)
        fleet.tick(now_s=k + 0.5)
    for k in range(13, 25):  # b is silent; a's ranks wait on
        node_a(k)
        assert not [f for f in fleet.tick(now_s=k + 0.5) if f.kind == "hang"]
    node_b(25, [False, 9.0, None, "idle: 0% CPU", 9.0, False])
    node_a(25)
    found = fleet.tick(now_s=25.5)
    hosts = [f for f in fleet.findings() if f.kind == "host"]
    assert len(hosts) == 1 and "b's reports came" in hosts[0].summary
    hangs = [f for f in fleet.findings() if f.kind == "hang"]
    assert [f.ranks for f in hangs] == [[3]], [f.summary for f in fleet.findings()]
    assert any(f.kind == "hang" for f in found)
    for k in range(26, 30):  # named once
        node_a(k)
        node_b(k, [False, k - 16.0, None, "idle: 0% CPU", k - 16.0, False])
        fleet.tick(now_s=k + 0.5)
    assert len([f for f in fleet.findings() if f.kind == "hang"]) == 1


def test_watch_and_metrics_show_a_long_wait_as_a_state_and_hung_ranks_only_on_a_hang():
    from distdoctor.diagnosis.hangs.hang import RankView
    from distdoctor.export.metrics import RANK_STATES
    from distdoctor.findings import Finding
    from distdoctor.views.rank import judged_states, rank_state

    s = 1_000_000_000
    waiting = RankView(1, _op(1, 5, False, 10 * s), _op(1, 4, True, 9 * s), 40 * s, None, {})
    busy = RankView(0, _op(0, 4, True, 9 * s), _op(0, 4, True, 9 * s), 40 * s, None, {})
    long = Finding("long_wait", "info", "long wait: rank 0 ...", [0], "0", 5,
                   details={"in_flight": True, "waiting_ranks": [1]})
    judged = judged_states([long])
    assert rank_state(busy, False, 0.1, None, judged)[0] == "long wait"
    assert rank_state(waiting, False, 0.1, None, judged)[0] == "in collective"
    hang = Finding("hang", "error", "hang: rank 0 never joined ...", [0], "0", 5)
    assert rank_state(waiting, False, 0.1, None, judged_states([hang]))[0] == "hung"
    # the fixed rule: past the timeout is hung, whatever the findings
    assert rank_state(waiting, False, 0.1, 20.0, {})[0] == "hung"
    assert "long_wait" in RANK_STATES


def _p2p(rank: int, index: int, op: str, peer: int, t: int) -> Event:
    return Event(rank=rank, index=index, kind="p2p", op=op, status="in_flight", group="0",
                 group_desc="default_pg", group_ranks=(0, 1), seq=0, peer=peer,
                 shapes=((1024,),), dtypes=("float32",), device="cpu", numel_in=1024,
                 numel_out=1024, reduce_op=None,
                 callsite={"file": "/job/pp.py", "line": 20 + index, "function": "stage"},
                 t_enter_ns=t, t_end_ns=None, span_index=0, name=None, error=None,
                 is_async=op == "send", other_thread=False)


def test_a_dropped_isend_is_named_at_its_line():
    """Rank 0's isend (never waited, never completed) then its recv from rank 1; rank 1
    waits in the recv that send should have matched: the isend is the culprit."""
    from distdoctor.diagnosis.engine.core import Engine

    s = 1_000_000_000
    engine = Engine(None)
    engine.ingest([_p2p(0, 1, "send", 1, 10 * s), _p2p(0, 2, "recv", 1, 10 * s),
                   _p2p(1, 1, "recv", 0, 10 * s)], 10.0)
    engine.same_clock.update((0, 1))
    for r in (0, 1):
        engine.heartbeat(r, 10 * s, 10.0)
    assert not [f for f in engine.tick(12.0) if f.kind == "hang"]  # too early to say
    (f,) = [f for f in engine.tick(16.0) if f.kind == "hang"]
    assert f.ranks == [0] and f.details["reason"] == "dropped_send", f.summary
    assert f.callsites[0] == {"rank": 0, "file": "/job/pp.py", "line": 21, "function": "stage"}
    assert not [g for g in engine.findings() if g.kind == "deadlock"]
