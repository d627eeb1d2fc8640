"""The engine's C ingest (diagnosis/engine/_ingest.c) leaves the state the Python one leaves.

Engine.ingest_one is the reference and the fallback; the C path takes the common event (a
finished collective of a rank's main thread, its rendezvous completed in agreement) on
the same objects. Held to the same state, field by field, and the same findings on real
gloo jobs of the kinds that leave that path (spans, p2p, a thread on its own group; the
main thread's sampled lines, in steps and between them, take a C path of their own), fed
in the order a live reader gives them (a poll of each rank's log in turn: rendezvous open
across polls; each rank's newest op in flight, finished in the next poll) and in time
order; and a
detector that fails on the C path is said and the others go on, as on the Python one.
"""

from __future__ import annotations

import random
from dataclasses import fields, make_dataclass, replace

import pytest

from distdoctor.diagnosis.engine import core
from distdoctor.diagnosis.engine.core import Engine
from distdoctor.diagnosis.stragglers.steptime import KEEP
from distdoctor.diagnosis.stragglers.waitgraph import KEEP_STEPS
from distdoctor.runlog.event import Event
from distdoctor.runlog.follow import RunFollower
from tests.conftest import run_job

needs_native = pytest.mark.skipif(core._NATIVE is None, reason="the C ingest is not built")

# DDP steps, span-less loops, a thread on its own group, p2p; a loop past every per-step
# table's bound
JOBS = ["ingest_shapes.py", "ingest_long.py"]


def state(e: Engine) -> dict:
    """Everything the engine and its detectors keep that the ingest writes."""
    s, t = e.straggler, e.steptime
    return {
        "ranks": {r: (st.latest and st.latest.index, st.last_done and st.last_done.index,
                      dict(st.issued), st.max_t_ns, {k: tuple(v) for k, v in st.completed.items()},
                      [x.index for x in st.recent], dict(st.names))
                  for r, st in e.ranks.items()},
        "open": {k: (list(rv.arrivals), rv.done, rv.first_raw, rv.first_seen_s,
                     rv.mismatch_since_s) for k, rv in e.open.items()},
        "found": {k: f.to_json() for k, f in e.found.items()}, "site_wait": e.site_wait,
        "obs": {r: list(q) for r, q in s.obs.items()},
        "steps": {r: (list(x.totals.items()), x.first, list(x.old_keys), list(x.old_sums))
                  for r, x in s.steps.items()},
        "members": s.members, "via": s.graph.via,
        "edges": {w: [(k, v) for k, v in st.items()] for w, st in s.graph.edges.items()},
        "time": {r: ([(k, x.wall_ms, x.coll_ms, x.data_ms, x.batches, x.first_enter_ns,
                       x.samples, x.by_group, x.children) for k, x in rs.steps.items()],
                     rs.pattern.period, rs.pattern.count, rs.pattern.start, rs.group_desc,
                     rs._turns, list(rs.loose), rs.sample_period_ms, rs._last_sample_ns)
                 for r, rs in t.ranks.items()},
        "keys": list(t._keys.items()), "assigned": t._assigned, "turn": t._turn,
        "thread": (t.thread.seen, t.thread.users, t.thread.of, list(t.thread.flagged)),
        "gaps": (e.gaps.open, e.gaps.before, e.gaps.last, e.gaps.moved_ns, e.gaps.seen_ns),
        "habits": (e.habits.of, e.habits._count),
        "ingested": e.ingested, "off": e.boundary.off}


def replay(batches: list[list], native) -> tuple[dict, list]:
    saved, core._NATIVE = core._NATIVE, native
    try:
        engine, found = Engine(hang_timeout_s=None), []
        for i, batch in enumerate(batches):
            engine.ingest(batch, 100.0 + i)
            found += [f.to_json() for f in engine.tick(100.0 + i)]
        found += [f.to_json() for f in engine.tick(None, final=True)]
        return state(engine), found
    finally:
        core._NATIVE = saved


def by_rank_polls(run_dir, per_poll: int = 40) -> list[list]:
    """Each rank's events in its own order, a poll's worth of each rank in turn."""
    follower = RunFollower(run_dir)
    events = follower.poll(final=True)
    follower.close()
    ranks: dict[int, list] = {}
    for ev in events:
        ranks.setdefault(ev.rank, []).append(ev)
    polls, at = [], 0
    while any(at < len(evs) for evs in ranks.values()):
        polls.append([ev for r in sorted(ranks) for ev in ranks[r][at:at + per_poll]])
        at += per_poll
    return polls


def newest_in_flight(polls: list[list], k: int = 3) -> list[list]:
    """The same polls as a reader that catches each rank's newest `k` collectives in
    flight sees them (a GPU's ops end after the CPU has issued more): in flight at the
    end of one poll, then finished at the start of the next."""
    out, late = [], []
    for poll in polls:
        batch, late = late, []
        newest: dict[int, list] = {}
        for ev in poll:
            if ev.kind == "collective" and ev.t_end_ns is not None:
                newest.setdefault(ev.rank, []).append(ev)
        caught = {id(ev) for evs in newest.values() for ev in evs[-k:]}
        for ev in poll:
            if id(ev) in caught:
                batch.append(replace(ev, t_end_ns=None, status="in_flight"))
                late.append(ev)
            else:
                batch.append(ev)
        out.append(batch)
    return out + [late]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> dict[str, list[list]]:
    """Each job's events, as a live reader's polls."""
    out = {}
    for job in JOBS:
        run_dir = tmp_path_factory.mktemp("ingest") / "run"
        run_job(job, 2, run_dir, timeout=150)
        out[job] = by_rank_polls(run_dir)
        assert sum(map(len, out[job])) > 5, job
    return out


@needs_native
@pytest.mark.timeout(400)
def test_the_c_ingest_leaves_the_python_state(recorded):
    taken = 0
    for job, polls in recorded.items():
        flat = sorted((ev for p in polls for ev in p), key=lambda e: e.t_end_ns or e.t_enter_ns)
        for batches in (polls, newest_in_flight(polls),
                        [flat[i:i + 64] for i in range(0, len(flat), 64)]):
            py_state, py_found = replay(batches, None)
            c_state, c_found = replay(batches, core._NATIVE)
            for part in py_state:
                assert c_state[part] == py_state[part], f"{job}: {part} differs"
            assert c_found == py_found, job
            if job == "ingest_long.py":  # every per-step table dropped its oldest
                assert all(len(steps[2]) > 0 for steps in py_state["steps"].values())
                assert all(len(t[0]) == KEEP for t in py_state["time"].values())
                assert all(len(e) == KEEP_STEPS for e in py_state["edges"].values())
        taken += core._NATIVE.ingest(Engine(hang_timeout_s=None), flat, 100.0)
        # ops read in flight and their ends take the C path too (a GPU job's common case):
        # each such op is taken twice, where the Python code would have taken both
        caught = newest_in_flight(polls)
        seen_in_flight = sum(ev.t_end_ns is None for p in caught for ev in p)
        plain = sum(core._NATIVE.ingest(e, p, 1.0) for e in [Engine()] for p in polls)
        assert sum(core._NATIVE.ingest(e, p, 1.0) for e in [Engine()] for p in caught) \
            >= plain + seen_in_flight // 2 > plain
    assert taken > 100  # the common path was taken, not only the fallback


@needs_native
@pytest.mark.timeout(200)
def test_a_detector_failing_in_the_c_path_is_said_and_the_others_go_on(recorded):
    polls = recorded["ingest_shapes.py"]
    out = {}
    for native in (None, core._NATIVE):
        saved, core._NATIVE = core._NATIVE, native
        try:
            engine = Engine(hang_timeout_s=None)
            engine.ingest(polls[0][:4], 1.0)
            # a rank's step sums made unusable (what a bug in the tracker would leave)
            obs = engine.straggler.obs
            engine.straggler._observer = lambda rank, obs=obs: obs.setdefault(rank, [])
            for i, batch in enumerate(polls[1:]):
                engine.ingest(batch, 2.0 + i)
            found = engine.tick(None, final=True)
        finally:
            core._NATIVE = saved
        out[native is None] = ({f.kind for f in found}, engine.ingested,
                               {k: len(rv.arrivals) for k, rv in engine.open.items()})
        internal = [f for f in found if f.kind == "internal"]
        assert internal and "straggler" in internal[0].summary, found
    assert out[True] == out[False]


@needs_native
@pytest.mark.timeout(60)
def test_events_of_another_kind_beside_the_decoders_are_left_to_python(recorded):
    """A caller may feed ingest_one objects that are not the decoder's Event (a rank's
    events re-made as another class): a rendezvous holding one is never read by offset."""

    # Event's fields, as a plain class
    foreign = make_dataclass("Foreign", [(f.name, f.type, f) for f in fields(Event)])
    polls = [[foreign(*(getattr(ev, f.name) for f in fields(ev))) if ev.rank == 0 else ev
              for ev in poll] for poll in recorded["ingest_shapes.py"]]
    py_state, py_found = replay(polls, None)
    c_state, c_found = replay(polls, core._NATIVE)
    assert c_state == py_state and c_found == py_found


ODD = [-1, 0, 2**61 + 1, 2**63, -2**63 - 1, 10**30, True, 1.5, None, "x", "", "undefined",
       (), (0, 0), ("a",), ([],), {}, {"thread_id": "x"}, {"thread_id": 2**70},
       {"file": 3, "line": None}]


@needs_native
@pytest.mark.timeout(120)
def test_odd_field_values_leave_the_same_state_both_ways(recorded):
    """Each of 300 copies of the job's events with one field of a few events set to an
    odd value (a number past 64 bits, a negative one, another type): the C ingest takes
    them as the Python one does, state and findings (a failure said for the same part:
    where it was raised is a line of C or of Python), and never crashes."""
    rng = random.Random(49)
    polls = newest_in_flight(recorded["ingest_shapes.py"])
    names = [f.name for f in fields(polls[0][0])]
    for _ in range(300):
        odd = [[replace(ev) for ev in poll] for poll in polls]
        for _ in range(3):
            poll = rng.choice(odd)
            setattr(rng.choice(poll), rng.choice(names), rng.choice(ODD))
        py_state, py_found = replay(odd, None)
        c_state, c_found = replay([list(p) for p in odd], core._NATIVE)
        py_state["found"], c_state["found"] = (
            _parts(py_state["found"].values()), _parts(c_state["found"].values()))
        assert c_state == py_state and _parts(c_found) == _parts(py_found)


def _parts(found) -> list:
    """Findings, an internal one (a failure) by the part that failed, not where."""
    return [(f["kind"], f["summary"].split(" detector failed")[0]) if f["kind"] == "internal"
            else f for f in found]


@needs_native
def test_a_tables_oldest_is_found_again_after_the_dict_packed_its_slots():
    """The C ingest drops a per-step table's oldest from where it last found it (a dict's
    emptied slots stay until it packs them). A table packed since (grown past its room)
    holds its oldest at the start again: that is the one dropped."""
    drop = core._NATIVE._drop_oldest
    table = {k: -k for k in range(300)}
    assert [drop(table) for _ in range(10)] == [(k, -k) for k in range(10)]
    table.update((k, -k) for k in range(300, 2000))  # packed: key 10 now in slot 0
    assert [drop(table)[0] for _ in range(3)] == [10, 11, 12]
    other = {k: k for k in range(20)}  # a new table, maybe where an old one was
    assert drop(other) == (0, 0)
    assert list(table)[:2] == [13, 14] and len(other) == 19
