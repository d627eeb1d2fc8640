"""Digests (`run --forward --forward-digest`): each node sends its ranks' positions and the
signatures of the collectives they entered instead of every event; the collector finds
hangs and mismatches across nodes from them (collect/digest.py, collect/fleet.py).

Two "nodes" are two torchrun launches (node ranks 0 and 1) on this host, each under its
own `distdoctor run`; the culprit is always on the other node from the ranks it stops."""

from __future__ import annotations

import json
import sys
from dataclasses import replace

import pytest
from conftest import JOBS, Lines, _kill_ranks, start_cli, stop_process

from distdoctor.collect.digest import DigestBuilder, event_row, row_event
from distdoctor.collect.fleet import FleetEngine
from distdoctor.collect.wire import WireError
from distdoctor.diagnosis.engine.core import Engine
from distdoctor.launch.env import free_port
from distdoctor.runlog.reader import Event

BUGS = JOBS / "bugs"


def two_nodes(tmp_path, job: str, collector_args=()):
    port, master = free_port(), free_port()
    collector = start_cli(["watch", "--listen", f"127.0.0.1:{port}", str(tmp_path / "copy"),
                           "--hang-timeout", "5", *collector_args])
    said = Lines(collector)
    said.wait_for("collecting on", 30)
    nodes = []
    for node_rank in (0, 1):
        nodes.append((tmp_path / f"node{node_rank}", start_cli([
            "run", "--run-dir", str(tmp_path / f"node{node_rank}"), "--forward",
            f"127.0.0.1:{port}", "--forward-digest", "--hang-timeout", "30", "--",
            sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank",
            str(node_rank), "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
            "--master-port", str(master), str(BUGS / job)])))
    return collector, said, nodes


def _rank_states(url: str) -> dict[str, str]:
    """rank -> its state, from the distdoctor_rank_state series set to 1."""
    import re
    import urllib.request

    with urllib.request.urlopen(url, timeout=10) as resp:
        text = resp.read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("distdoctor_rank_state{") and line.endswith(" 1.0"):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
            out[labels["rank"]] = labels["state"]
    return out


def stop_all(collector, nodes) -> int:
    for run_dir, proc in nodes:
        stop_process(proc)
        _kill_ranks(run_dir)
    return stop_process(collector)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("job, kind, says", [
    # rank 3 (node 1) spins outside any collective; ranks 0-2 wait in all_reduce
    ("stuck_outside.py", "HANG", "rank 3 never joined all_reduce #2 in group 0"),
    # rank 3 (node 1) all-reduces 65 elements where ranks 0-2 (both nodes) send 64
    ("shape_mismatch.py", "MISMATCH", "rank 3 issued all_reduce 65 float32 sum"),
])
def test_a_culprit_on_the_other_node_is_found_from_digests(tmp_path, job, kind, says):
    metrics = free_port()
    collector, said, nodes = two_nodes(tmp_path, job, ("--metrics", f"127.0.0.1:{metrics}"))
    try:
        line = said.wait_for(kind, 90)
        assert says in line, line
        if kind == "HANG":  # the collector's /metrics: every rank, from the digests
            states = _rank_states(f"http://127.0.0.1:{metrics}/metrics")
            assert states == {"0": "hung", "1": "hung", "2": "hung", "3": "running"}, states
    finally:
        code = stop_all(collector, nodes)
    assert code == 0 and "Traceback" not in "".join(said.lines), "".join(said.lines)
    # the copy holds no events (digests only), and each node keeps all of its own
    assert not list((tmp_path / "copy" / "ranks").glob("*.ring"))
    assert sorted(p.name for p in (tmp_path / "node1" / "ranks").glob("*.ring")) == [
        "rank-00002.ring", "rank-00003.ring"]


@pytest.mark.timeout(150)
def test_a_rank_that_keeps_the_other_node_waiting_is_a_straggler_from_digests(tmp_path):
    """Rank 3 (node 1) computes 30 ms longer each step; DDP's all-reduce spans both nodes,
    so neither node can judge it alone: the collector does, from the waits."""
    collector, said, nodes = two_nodes(tmp_path, "../stragglers/slow_rank_long.py")
    try:
        line = said.wait_for("STRAGGLER", 120)
        assert "rank 3 (node " in line, line
    finally:
        code = stop_all(collector, nodes)
    assert code == 0 and "Traceback" not in "".join(said.lines), "".join(said.lines)
    findings = json.loads((tmp_path / "copy" / "findings.json").read_text())["findings"]
    late = [f for f in findings if f["kind"] == "straggler"]
    assert [f["ranks"] for f in late] == [[3]], findings
    assert 20 < late[0]["details"]["lateness_ms"] < 60, late[0]["summary"]


# --- in process -----------------------------------------------------------------------------

def op(rank, index, seq, numel=64, done=True, t=1_000_000_000, group="0", ranks=(0, 1, 2, 3)):
    return Event(rank=rank, index=index, kind="collective", op="all_reduce",
                 status="ok" if done else "in_flight", group=group, group_desc="default_pg",
                 group_ranks=ranks, seq=seq, peer=None, shapes=((numel,),),
                 dtypes=("float32",), device="cpu", numel_in=numel, numel_out=numel,
                 reduce_op="sum", callsite={"file": "/job/t.py", "line": 9, "function": "f"},
                 t_enter_ns=t, t_end_ns=t + 1000 if done else None, span_index=0, name=None,
                 error=None, is_async=False, other_thread=False)


def test_an_op_survives_the_digest_encoding():
    ev = op(2, 7, 3, done=False)
    back = row_event(2, event_row(ev), {"0": ("default_pg", (0, 1, 2, 3))})
    assert back == replace(ev, device="", is_async=None)


def test_two_nodes_signatures_of_one_collective_are_compared():
    """Node a's ranks 0-1 and node b's rank 2 send 64 elements, rank 3 sends 65: one
    finding naming rank 3 once SETTLE_S has passed; agreeing collectives leave nothing."""
    fleet = FleetEngine(hang_timeout_s=60, settle_s=1.0)
    for host, ranks in (("a", (0, 1)), ("b", (2, 3))):
        b = DigestBuilder()
        b.feed([op(r, i, i) for i in range(3) for r in ranks])
        b.feed([op(r, 3, 3, numel=65 if r == 3 else 64) for r in ranks])
        fleet.apply(_digest(b, host), now_s=10.0)
    assert list(fleet.open) == [("0", 3)]  # seqs 0-2 agreed and are forgotten
    assert fleet.tick(now_s=10.5) == []
    found = fleet.tick(now_s=11.1)
    assert [(f.kind, f.ranks, f.seq) for f in found] == [("mismatch", [3], 3)]


def _digest(builder: DigestBuilder, host: str) -> dict:
    return builder.take(Engine(), 0.0, host)  # no positions here: arrivals only


@pytest.mark.parametrize("payload", [
    {},
    {"host": "a", "groups": {}, "sigs": {}, "ranks": [[0, "x", None, {}, 1, None, False]],
     "arrivals": []},
    {"host": "a", "groups": {"0": [1]}, "sigs": {}, "ranks": [], "arrivals": []},
    {"host": "a", "groups": {}, "sigs": {}, "ranks": [], "arrivals": [["0", "x", 0, [1], 1]]},
    {"host": "a", "groups": {}, "sigs": {}, "ranks": [], "arrivals": [["0", 1, 0, [1]]]},
    {"host": "a", "groups": {}, "sigs": {"0": [1, 2]}, "ranks": [], "arrivals": []},
    {"host": "a", "groups": {}, "sigs": {}, "ranks": [[0, None, None, {"0": "x"}, 1, None,
                                                        False]], "arrivals": []},
    {"host": "a", "groups": {}, "sigs": {}, "ranks": [[0, ["x"] * 16, None, {}, 1, None,
                                                        False]], "arrivals": []},
    {"host": "a", "groups": {}, "sigs": {}, "ranks": [[0, None, None, {}, "now", None,
                                                        False]], "arrivals": []},
])
def test_a_malformed_digest_is_refused_whole(payload):
    fleet = FleetEngine()
    with pytest.raises(WireError):
        fleet.apply(payload)
    assert not fleet.positions and not fleet.open


def test_an_op_with_a_malformed_field_is_refused_with_its_digest():
    """A position's ops are decoded only when an op is stuck, on the diagnosis thread: a
    malformed field there (shapes) is refused with the whole digest as it comes
    (digest_fields.py), so no op kept can fail to decode later."""
    fleet = FleetEngine(hang_timeout_s=1)
    row = event_row(op(0, 5, 5, done=False, t=0))
    row[7] = [["not a number"]]
    with pytest.raises(WireError, match="shape"):
        fleet.apply({"host": "a", "groups": {}, "sigs": {}, "arrivals": [],
                     "ranks": [[0, row, None, {"0": 6}, 5_000_000_000, None, False]]},
                    now_s=1.0)
    assert not fleet.positions and fleet.tick(now_s=1.5) == []


# --- stragglers across nodes and the collector's rows ---------------------------------------

WORLD = tuple(range(8))  # 4 nodes x 2 ranks, one group over all of them


def _late_job(late: dict[int, float], seconds: int = 16, per_s: int = 10) -> FleetEngine:
    """Nodes a-d (ranks 0-1, 2-3, ...) digest a job whose ranks in `late` (rank -> ms)
    enter every all_reduce that much after the others; each digest reports the waits of
    the collectives its ranks finished."""
    fleet = FleetEngine(hang_timeout_s=60)
    nodes = {host: (DigestBuilder(), Engine(), (2 * i, 2 * i + 1))
             for i, host in enumerate("abcd")}
    worst = max(late.values(), default=0.0)
    for second in range(seconds):
        for host, (builder, engine, ranks) in nodes.items():
            events = []
            for k in range(per_s):
                seq = second * per_s + k
                start = second * 1_000_000_000 + k * 50_000_000
                end = start + int((worst + 1) * 1e6)
                for r in ranks:
                    enter = start + int(late.get(r, 0.0) * 1e6)
                    ev = op(r, seq, seq, t=enter, ranks=WORLD)
                    events.append(replace(ev, t_end_ns=end))
            engine.ingest(events, now_s=second + 0.5)
            builder.feed(events)
            fleet.apply(builder.take(engine, second + 0.5, host), now_s=second + 0.5)
    return fleet


def test_a_rank_late_against_the_ranks_on_other_nodes_is_a_straggler():
    fleet = _late_job({5: 30.0})
    found = fleet.tick(now_s=16.5)
    stragglers = [f for f in found if f.kind == "straggler"]
    assert [f.ranks for f in stragglers] == [[5]], [f.summary for f in found]
    assert "rank 5 (node c)" in stragglers[0].summary, stragglers[0].summary
    assert 25 < stragglers[0].details["lateness_ms"] / 10 < 35  # 10 collectives a second


def test_a_whole_node_late_together_is_one_finding_about_the_node():
    """Both of node c's ranks arrive 30 ms late: neither is late beside the other (the
    rank measure is ~0), the node is late beside the other nodes."""
    fleet = _late_job({4: 30.0, 5: 30.0})
    found = [f for f in fleet.tick(now_s=16.5) if f.kind == "straggler"]
    assert [f.ranks for f in found] == [[4, 5]], [f.summary for f in found]
    assert "node c (ranks 4-5)" in found[0].summary, found[0].summary


def test_a_job_that_keeps_time_has_no_straggler():
    fleet = _late_job({})
    assert not [f for f in fleet.tick(now_s=16.5) if f.kind == "straggler"]
    assert fleet.lateness.merged == 160  # every collective of the 16 s was merged


def test_the_collector_shows_the_digests_ranks_as_rows_and_metrics():
    from distdoctor.views.fleet_view import metric_ranks, rank_rows

    fleet = _late_job({5: 30.0}, seconds=12)
    rows = rank_rows(fleet, 12.0, skip=set(), rates={})
    assert [r.rank for r in rows] == list(WORLD)
    assert {r.host for r in rows} == set("abcd")
    assert all(r.state == "running" and r.collectives == 120 for r in rows), rows[0]
    assert rows[0].last_done == "all_reduce #119 (0)"
    ranks = metric_ranks(fleet, 12.0, skip={0})
    assert [m.rank for m in ranks] == list(WORLD[1:])
    assert ranks[0].done == [["0", "default_pg", "all_reduce", 120, pytest.approx(3.72)]]


def test_each_silent_node_is_lost_only_where_others_wait_for_its_ranks():
    """Eight nodes of two ranks; h2, h5, h6 and h7 fall silent. Ranks 0-3 (h0, h1) wait
    in an all_reduce of ranks 0-13 (members on h2, h5 and h6, none on h7); rank 6 (h3)
    waits in a recv from rank 12 (h6); rank 8 (h4) waits too briefly to count. h2, h5 and
    h6 are lost, each with the ranks waiting on it; h7, with nobody waiting on it, is
    not. (One pass over the positions finds them all, lost.py.)"""
    from distdoctor.collect.lost import Position, lost_node_findings

    group = tuple(range(14))
    positions = {r: Position(r, f"h{r // 2}", op(r, 5, 5, ranks=group), 0.0)
                 for r in range(16)}
    for r in (0, 1, 2, 3):
        positions[r] = Position(r, positions[r].host, op(r, 6, 6, done=False, ranks=group),
                                40.0)
    recv = replace(op(6, 6, 0, done=False, group="p2p", ranks=(6, 12)), kind="p2p",
                   op="recv", peer=1)  # the group's rank 1: global rank 12
    positions[6] = Position(6, "h3", recv, 40.0)
    positions[8] = Position(8, "h4", op(8, 6, 6, done=False, ranks=group), 1.0)
    silent = {h: (9.0, False) for h in ("h2", "h5", "h6", "h7")}
    found = {f.details["host"]: f for f in lost_node_findings(silent, positions, 30.0)}
    assert sorted(found) == ["h2", "h5", "h6"], found
    assert [(found[h].ranks, found[h].details["waiting_ranks"]) for h in sorted(found)] == [
        ([4, 5], [0, 1, 2, 3]), ([10, 11], [0, 1, 2, 3]), ([12, 13], [0, 1, 2, 3, 6])]
    assert lost_node_findings({"h7": (9.0, False)}, positions, 30.0) == []


def test_a_node_of_a_job_past_fifty_thousand_ranks_sends_its_digest_once_a_second(tmp_path):
    """The collector goes through every rank's position each round of digests; past
    DIGEST_SLOWER_PAST ranks in the job (as the ranks' own logs say it), a node sends
    once a second instead of twice (forward.py)."""
    from distdoctor.collect import forward
    from distdoctor.runlog import format as F
    from distdoctor.runlog.ring import RingWriter
    from distdoctor.runlog.rundir import ring_path

    def interval(world: int | None) -> float:
        run_dir = tmp_path / f"node{world}"
        (run_dir / "ranks").mkdir(parents=True)
        if world is not None:
            RingWriter(str(ring_path(run_dir, 3)), 3, 64 * F.SLOT_SIZE, 4096,
                       launch={"world": world}).close()
        fwd = forward.Forwarder(run_dir, ("127.0.0.1", 9))
        fwd._discover()
        return fwd.digest_interval_s()

    assert interval(None) == interval(4096) == interval(50_000) == forward.DIGEST_INTERVAL_S
    assert interval(100_000) == forward.DIGEST_SLOWER_S > forward.DIGEST_INTERVAL_S
