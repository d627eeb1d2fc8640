"""Units of the group-order cause, the detectors' boundary and what a mismatch makes the
job print: one group name that stands for two member lists (groups created in a
rank-dependent order) is never one rendezvous; a detector that raises is one internal
finding and the engine goes on; a CPU allocation that fails inside the mismatched op is
the mismatch's consequence."""

from __future__ import annotations

from dataclasses import replace

from distdoctor.diagnosis.engine.core import Engine
from distdoctor.diagnosis.hangs.group_order import GroupNames
from distdoctor.findings import Finding
from distdoctor.runlog.reader import Event

S = 1_000_000_000


def _op(rank, seq, ranks, group="1", t=0.0, done=True, numel=8, index=None, line=34):
    return Event(rank=rank, index=seq if index is None else index, kind="collective",
                 op="all_reduce", status="ok" if done else "in_flight", group=group,
                 group_desc="", group_ranks=tuple(ranks), seq=seq, peer=None,
                 shapes=((numel,),), dtypes=("float32",), device="cpu", numel_in=numel,
                 numel_out=numel, reduce_op="sum",
                 callsite={"file": "/job/job.py", "line": line, "function": "<module>"},
                 t_enter_ns=int(t * S), t_end_ns=int((t + 0.001) * S) if done else None,
                 span_index=0, name=None, error=None, is_async=False, other_thread=False)


def test_one_name_for_two_member_lists_is_never_one_rendezvous():
    """Ranks 1 and 2 each finished "group 1" #0 (one with members [0, 1], the other
    [2, 3]) while rank 3, a member of [2, 3], is still in it: the old key took the two
    finished arrivals for a complete rendezvous and the straggler judge subtracted from
    rank 3's missing end."""
    engine = Engine(hang_timeout_s=5.0)
    engine.ingest([_op(2, 0, (2, 3)), _op(1, 0, (0, 1)), _op(3, 0, (2, 3), done=False)], 0.0)
    engine.tick(1.0)
    assert not [f for f in engine.findings() if f.kind == "internal"]
    open_ones = {rv.members: sorted(rv.arrivals) for rv in engine.open.values()}
    assert open_ones == {(0, 1): [1], (2, 3): [2, 3]}
    cause = [f for f in engine.findings() if f.details.get("reason") == "group_creation_order"]
    assert len(cause) == 1 and cause[0].kind == "mismatch" and cause[0].severity == "error"
    assert cause[0].ranks == [] and cause[0].details["tie"]
    assert "group 1 is [0, 1] on rank 1; [2, 3] on ranks 2, 3" in cause[0].summary


def test_group_names_of_5000_digits_in_conflict_are_the_cause_not_an_internal_error():
    """A log's counter names past int()'s 4,300 digits: two of them in conflict are
    ordered as numbers without int() (creations.counter_order), and said as the cause.
    Before: ValueError in the sort, an internal finding instead."""
    big, bigger = "9" * 5000, "1" + "0" * 5000
    engine = Engine(hang_timeout_s=5.0)
    engine.ingest([_op(0, 0, (0, 1), group=big), _op(2, 0, (2, 3), group=big, index=0),
                   _op(1, 0, (0, 1), group=bigger), _op(3, 0, (2, 3), group=bigger)], 0.0)
    engine.tick(1.0)
    assert not [f for f in engine.findings() if f.kind == "internal"], engine.findings()
    [cause] = [f for f in engine.findings()
               if f.details.get("reason") == "group_creation_order"]
    assert cause.details["group_name"] == big and bigger in cause.details["other_names"]


def test_the_rank_that_calls_a_group_by_another_name_is_the_odd_one():
    """8 ranks; rank 7 alone creates [4..7] before [0..3]: its "1" is [4..7], which
    ranks 4, 5, 6 call "2"."""
    names = GroupNames()
    for r in range(4):
        names.variant("1", (0, 1, 2, 3), r, None)
    for r in (4, 5, 6):
        names.variant("2", (4, 5, 6, 7), r, None)
    names.variant("1", (4, 5, 6, 7), 7, None)
    assert names.conflicts() == ["1"]
    assert names.odd_ranks() == [7]


def test_one_name_one_member_list_is_no_finding():
    engine = Engine(hang_timeout_s=5.0)
    for seq in range(3):
        engine.ingest([_op(r, seq, (0, 1), t=seq) for r in (0, 1)], 0.0)
    engine.tick(1.0)
    assert engine.findings() == [] and not engine.open


def test_a_detector_that_raises_is_one_internal_finding_and_the_others_go_on():
    engine = Engine(hang_timeout_s=1.0)
    engine.same_clock.update({0, 1})  # the ranks' clock is the engine's: waits are known

    def broken(*args, **kwargs):
        raise ZeroDivisionError("broken by the test")

    engine.straggler.observe = broken  # per completed collective
    engine.thread_use.findings = broken  # per pass
    engine.ingest([_op(r, 0, (0, 1), group="0") for r in (0, 1)], 0.0)
    engine.ingest([_op(0, 1, (0, 1), group="0", t=1.0, done=False)], 0.0)
    for now in (1.0, 5.0, 6.0):
        engine.tick(now)
    found = engine.findings()
    internal = {f.details["detector"]: f for f in found if f.kind == "internal"}
    assert set(internal) == {"straggler", "threads"}
    for f in internal.values():
        assert f.severity == "warning" and f.ranks == []
        assert f.details["exception"] == "ZeroDivisionError"
        assert f.details["site"].startswith("diagnosis/engine")
    assert internal["threads"].details["failures"] == 1  # switched off after the first
    hang = [f for f in found if f.kind == "hang"]
    assert hang and hang[0].ranks == [1]  # rank 1 never joined #1: the hang still said


def test_a_cpu_allocation_that_fails_inside_the_mismatched_op_is_its_consequence():
    """Rank 0 all_gathers 8 elements, rank 1 16 at #1; rank 0's allocator then fails on
    the size it received: not host memory, the mismatch."""
    engine = Engine(hang_timeout_s=60.0)
    engine.ingest([_op(r, 0, (0, 1), group="0") for r in (0, 1)], 0.0)
    engine.ingest([_op(0, 1, (0, 1), group="0", t=1.0, done=False, numel=8),
                   _op(1, 1, (0, 1), group="0", t=1.0, done=False, numel=16)], 0.0)
    alloc = Finding("crash", "error", "host memory exhausted (CPU allocation failed) on rank 0",
                    [0], details={"source": "log", "family": "oom", "rule": "host_alloc_failed",
                                  "signature": "log/oom/host_alloc_failed",
                                  "requested": 93824992236544})
    engine.tick(1.0)
    engine.add_finding(alloc)
    engine.tick(3.0)
    found = engine.findings()
    assert [f.kind for f in found if f.severity == "error"] == ["mismatch"]
    said = [f for f in found if f.details.get("rule") == "host_alloc_failed"]
    assert len(said) == 1 and said[0].severity == "warning"
    assert said[0].details["consequence_of_mismatch"]
    assert "not host memory exhausted" in said[0].summary


def _made(rank, index, name, ranks, line, done=True, t=0.0):
    """The tracer's span around one group creation (tracer/groups.py)."""
    return Event(rank=rank, index=index, kind="span", op="span",
                 status="ok" if done else "in_flight", group=name, group_desc="",
                 group_ranks=tuple(ranks), seq=0, peer=None, shapes=(), dtypes=(),
                 device="", numel_in=0, numel_out=0, reduce_op=None,
                 callsite={"file": "/nonexistent/job.py", "line": line, "function": "<module>"},
                 t_enter_ns=int(t * S), t_end_ns=int((t + 0.001) * S) if done else None,
                 span_index=0, name="new_group", error=None, is_async=False,
                 other_thread=False, implicit=True)


def test_creations_alone_show_a_group_its_non_members_skipped():
    """4 ranks create two groups in one order and groups named by their members
    (use_local_synchronization: created by the members alone, legal): nothing. Then 0, 1, 2
    create [0, 1] (line 12) and [0, 1, 2, 3] (line 13); rank 3 skips the first, so its "3"
    is everyone. No op ran: the creations say it, rank 3 is the odd one, and ranks inside
    new_group for 6 s make it a hang."""
    engine = Engine(hang_timeout_s=None)
    for i, members in enumerate([(0, 1), (2, 3)]):
        engine.ingest([_made(r, i, str(i + 1), members, 10 + i) for r in range(4)], 0.0)
    engine.ingest([_made(r, 2, "9f2c" if r % 2 == 0 else "41ab", (0, 2) if r % 2 == 0
                         else (1, 3), 20) for r in range(4)], 0.0)
    engine.tick(0.5)
    assert engine.findings() == []
    engine.ingest([_made(r, 3, "3", (0, 1), 12) for r in (0, 1, 2)]
                  + [_made(r, 4, "4", (0, 1, 2, 3), 13, done=False) for r in (0, 1, 2)]
                  + [_made(3, 3, "3", (0, 1, 2, 3), 13, done=False)], 0.0)
    engine.tick(1.0)
    [f] = [f for f in engine.findings() if f.details.get("reason") == "group_creation_order"]
    assert f.kind == "mismatch" and f.ranks == [3]
    orders = {tuple(o["ranks"]): [c["line"] for c in o["created"]]
              for o in f.details["creations"]}
    assert orders == {(0, 1, 2): [10, 11, 12, 13], (3,): [10, 11, 13]}
    for r in range(4):
        engine.heartbeat(r, int(6 * S), 6.0)
    engine.tick(6.0)
    [f] = [f for f in engine.findings() if f.details.get("reason") == "group_creation_order"]
    assert f.kind == "hang" and f.ranks == [3]


def test_counter_names_from_2_as_torch_2_15_gives_them_still_say_who_skipped():
    """torch 2.15 numbers a group named by its members too: a job whose first group is
    made with use_local_synchronization names its next ones "2", "3", ... on every rank.
    Read as logs that lost their group "1", every rank was left out and rank 2's skip of
    [0, 1] went unsaid (CI's version matrix: all_ops.py's first counter name was "2")."""
    engine = Engine(hang_timeout_s=None)
    engine.ingest([_made(r, 0, "9f2c", (0, 1, 2), 9) for r in range(3)], 0.0)
    engine.ingest([_made(r, 1, "2", (0, 1), 10) for r in (0, 1)]
                  + [_made(r, 2, "3", (0, 1, 2), 11, done=False) for r in (0, 1)]
                  + [_made(2, 1, "2", (0, 1, 2), 11, done=False)], 0.0)
    engine.tick(1.0)
    [f] = [f for f in engine.findings() if f.details.get("reason") == "group_creation_order"]
    assert f.ranks == [2], f.summary


def test_a_rank_whose_log_lost_its_first_creations_is_not_blamed_for_them():
    """Rank 2 skips [2, 3] (its "2" is everyone's "3"); rank 3's ring wrapped and kept
    only its creations from "2" on: it made [0, 1] like the others, the log lost it."""
    engine = Engine(hang_timeout_s=None)
    lists = [(0, 1), (2, 3), (0, 1, 2, 3)]
    engine.ingest([_made(r, i, str(i + 1), m, 10 + i) for r in (0, 1)
                   for i, m in enumerate(lists)], 0.0)
    engine.ingest([_made(2, 0, "1", lists[0], 10), _made(2, 1, "2", lists[2], 12)], 0.0)
    engine.ingest([_made(3, 7, "2", lists[1], 11), _made(3, 8, "3", lists[2], 12)], 0.0)
    engine.tick(1.0)
    [f] = [f for f in engine.findings() if f.details.get("reason") == "group_creation_order"]
    assert f.ranks == [2] and f.details["group_name"] == "2"


def _sample(rank, index, t=0.0):
    """The tracer's look at the main thread between ops (a rank's first event as often as
    not: it samples from its start)."""
    return Event(rank=rank, index=index, kind="sample", op="sample", status="ok", group="",
                 group_desc="", group_ranks=(), seq=0, peer=None, shapes=(), dtypes=(),
                 device="", numel_in=0, numel_out=0, reduce_op=None,
                 callsite={"file": "/nonexistent/job.py", "line": 5, "function": "<module>"},
                 t_enter_ns=int(t * S), t_end_ns=None, span_index=0, name=None, error=None,
                 is_async=False, other_thread=False)


def _rank0_alone_in(creations: dict[int, list], first_read: dict[int, int]) -> Engine:
    """4 ranks: each makes `creations[rank]` (events of _made with their index from 0),
    after a sample and an all_reduce of the default group; then rank 0 alone begins
    [0, 1] "3" (line 12) and stays inside, and ranks 1, 2, 3 wait for it in all_reduce #1.
    `first_read`: rank -> the number of its first event read (the sample; past 0: the
    ring wrapped before it was read, and `creations[rank]` is what it still held)."""
    engine = Engine(hang_timeout_s=5.0)
    engine.same_clock.update(range(4))
    for r in range(4):
        at = first_read.get(r, 0)
        engine.ingest([_sample(r, at, 0.1), _op(r, 0, range(4), group="0", index=at + 1,
                                                 t=0.2)], 0.0)
        engine.ingest([replace(m, rank=r, index=at + 2 + i, t_enter_ns=int((0.3 + i) * S),
                               t_end_ns=int((0.4 + i) * S))
                       for i, m in enumerate(creations[r])], 0.0)
    engine.ingest([_made(0, first_read.get(0, 0) + 9, "3", (0, 1), 12, done=False, t=5.0)]
                  + [_op(r, 1, range(4), group="0", index=first_read.get(r, 0) + 9,
                         t=5.0, done=False) for r in (1, 2, 3)], 0.0)
    engine.tick(5.0)
    engine.tick(15.0)
    return engine


def test_a_rank_whose_counter_names_start_later_is_no_log_that_lost_creations():
    """torch 2.15's names: ranks 0, 1 make [0, 1] by its members first (line 9), ranks 2,
    3 make [2, 3] by a plain new_group "1" (line 10), all make [0, 1, 2, 3] "2" (line 11):
    plain names from "2" on ranks 0, 1 and from "1" on ranks 2, 3, every log read from its
    first event. Rank 0, alone in a creation the others skipped, is the culprit. Before:
    ranks 0, 1 were read as logs that lost their group "1" and left out of the judgement
    (no culprit, a tie)."""
    made = {r: [_made(r, 0, "9f2c", (0, 1), 9) if r < 2 else _made(r, 0, "1", (2, 3), 10),
                _made(r, 0, "2", range(4), 11)] for r in range(4)}
    engine = _rank0_alone_in(made, {})
    [f] = [f for f in engine.findings() if f.details.get("reason") == "group_creation_skipped"]
    assert (f.kind, f.ranks) == ("hang", [0]) and "tie" not in f.details, f.summary
    assert f.details["never_created"] == [1, 2, 3], f.details
    assert engine.group_names.creations.whole(set(range(4))) == {0, 1, 2, 3}


def test_a_rank_whose_log_was_read_from_a_later_event_may_have_lost_creations():
    """All make [0, 1] "1" and [0, 1, 2, 3] "2"; rank 3's ring wrapped before it was read:
    its first event read (a sample) is number 40, and it holds "2" only. What it created
    before is unknown: it is never said to have skipped [0, 1] "1"."""
    made = {r: [_made(r, 0, "1", (0, 1), 10), _made(r, 0, "2", range(4), 11)]
            for r in range(3)}
    made[3] = made[2][1:]
    engine = _rank0_alone_in(made, {3: 40})
    assert engine.group_names.creations.whole(set(range(4))) == {0, 1, 2}
    [f] = [f for f in engine.findings() if f.details.get("reason") == "group_creation_skipped"]
    assert (f.kind, f.ranks) == ("hang", [0]) and "tie" not in f.details, f.summary
