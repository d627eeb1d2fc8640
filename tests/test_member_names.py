"""A group named by its members (`new_group(..., use_local_synchronization=True)`) that its
members name differently: torch salts the name with a count each rank keeps, so ranks that
made different numbers of groups before it wait on different store keys. Run for real on
gloo (the hang said as that cause: the names, the counts, the earlier creation only some
made, its rank condition), and as the engine sees torch 2.13's and 2.15's names (2.4's read
back too)."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch.distributed.distributed_c10d as c10d
from conftest import JOBS, marker_sets, run_cli

from distdoctor.diagnosis.engine.core import Engine
from distdoctor.diagnosis.hangs.member_names import read_count
from distdoctor.runlog.reader import Event

JOB = JOBS / "bugs" / "member_names.py"
S = 1_000_000_000


@pytest.mark.timeout(90)
@pytest.mark.skipif(not hasattr(c10d, "_hash_ranks_to_str"),
                    reason="this torch names a member-named group without a count")
def test_members_that_made_different_numbers_of_groups_name_one_group_apart(tmp_path):
    """4 ranks make, rightly, subgroups, member-named groups across them, a ring of pairs
    in orders that differ between non-members and twelve groups of one pair (none said);
    then ranks 0, 1 make [0, 1] once more inside `if rank < 2`, so [0, 2] and [1, 3] are
    named after one group more on ranks 0, 1 than on 2, 3, and all four wait inside
    new_group. Before: no finding at all, the job stopped only by the test's timeout."""
    run_dir = tmp_path / "run"
    proc = run_cli(["run", "--nproc", "4", "--run-dir", str(run_dir), "--grace", "2",
                    "--hang-timeout", "3", "--on-hang", "kill", "--", str(JOB), "diverge"],
                   timeout=60, run_dir=run_dir)
    findings = json.loads((run_dir / "findings.json").read_text())["findings"]
    described = "\n".join(f"{f['kind']} {f['ranks']} {f['summary']}" for f in findings)
    assert proc.returncode != 0 and "stopping the job (--on-hang kill)" in proc.stderr, (
        described + proc.stderr[-2000:])
    [f] = [f for f in findings if f["severity"] == "error"]
    marks = marker_sets(JOB)
    (extra,), (diverged,) = marks["extra"], marks["diverged"]
    d = f["details"]
    assert f["kind"] == "hang" and d["reason"] == "group_member_names", described
    assert d["members"] == [0, 2] and [n["ranks"] for n in d["names"]] == [[0], [2]], d
    assert d["names"][0]["name"] != d["names"][1]["name"]
    # the counts read back from the names: one group more on rank 0 (2.13: groups it is a
    # member of; 2.15: groups it created)
    assert d["counted"] in ("member", "created", "both"), d
    assert d["names"][0]["count"] == d["names"][1]["count"] + 1, d["names"]
    [e] = d["earlier"]
    assert (e["members"], e["line"], e["counts"]) == ([0, 1], extra, {"0": 1, "2": 0}), e
    assert e["branch"]["condition"] == "rank < 2" and e["branch"]["arm"] == "body", e
    assert (d["branch"]["created_by"], d["branch"]["skipped_by"]) == ([0, 1], [2, 3]), d
    assert [g["members"] for g in d["other_groups"]] == [[1, 3]], d
    assert f["ranks"] == [0, 1], described  # the guarded creation raised their counts
    lines = {(c["rank"], c["line"]) for c in f["callsites"]}
    assert {(0, diverged), (2, diverged), (0, extra)} <= lines, f["callsites"]
    for words in ("rank 0 named it", "rank 2 named it", f"member_names.py:{extra}",
                  "which ranks 0, 1 made and ranks 2, 3 did not", "`if rank < 2:`"):
        assert words in f["summary"], f["summary"]
    # post-mortem, from the logs alone: the same one cause
    post = run_cli(["diagnose", str(run_dir), "--json"], timeout=60)
    causes = [g for g in json.loads(post.stdout)["findings"] if g["severity"] == "error"]
    assert [(g["kind"], g["ranks"], g["details"]["reason"]) for g in causes] == [
        ("hang", [0, 1], "group_member_names")], post.stdout


@pytest.mark.timeout(60)
@pytest.mark.skipif(not hasattr(c10d, "_hash_ranks_to_str"),
                    reason="this torch names a member-named group without a count")
def test_a_member_that_never_calls_a_member_named_group_is_said(tmp_path):
    """After the healthy part, rightly: [1, 3] made by rank 1 at once and by rank 3 after 6 s
    of work while rank 0 waits for rank 1 (inside new_group), [0, 2] by its members at
    different times (none said, the progress rule deciding); then rank 0 alone makes [0, 2]
    inside `if rank == 0` and rank 2 goes on to all_reduce. Before: the late member's wait
    was a hang blaming rank 1 (the job stopped there), and the skipped group a plain hang
    blaming rank 0 that never said rank 2 never called it."""
    run_dir = tmp_path / "run"
    proc = run_cli(["run", "--nproc", "4", "--run-dir", str(run_dir), "--grace", "2",
                    "--on-hang", "kill", "--", str(JOB), "skip"], timeout=45, run_dir=run_dir)
    findings = json.loads((run_dir / "findings.json").read_text())["findings"]
    described = "\n".join(f"{f['kind']} {f['ranks']} {f['summary']}" for f in findings)
    assert proc.returncode != 0 and "stopping the job (--on-hang kill)" in proc.stderr, (
        described + proc.stderr[-2000:])
    [f] = findings  # the late member said nothing
    marks = marker_sets(JOB)
    (skipped,), (went_on,) = marks["skipped"], marks["went_on"]
    d = f["details"]
    assert (f["kind"], f["ranks"], d.get("reason")) == ("hang", [0], "group_member_skipped"), (
        described)
    assert (d["members"], d["created_by"], d["never_created"]) == ([0, 2], [0], [2]), d
    assert d["recipe"] == "salted", d  # torch 2.13 and 2.15: the members and a count
    assert d["branch"]["condition"] == "rank == 0" and d["branch"]["arm"] == "body", d
    assert (d["branch"]["created_by"], d["branch"]["skipped_by"]) == ([0], [2]), d
    lines = {(c["rank"], c["line"]) for c in f["callsites"]}
    assert {(0, skipped), (2, went_on)} <= lines, f["callsites"]
    for words in (f"rank 0 is inside new_group([0, 2]) at member_names.py:{skipped}",
                  "which rank 2, a member of it, never called",
                  f"rank 2 went on to all_reduce #1 in group 0 at member_names.py:{went_on}",
                  "`if rank == 0:`"):
        assert words in f["summary"], f["summary"]
    assert "on every member of the group" in f["remedy"] and "rank == 0" in f["remedy"]
    post = run_cli(["diagnose", str(run_dir), "--json"], timeout=30)
    causes = [g for g in json.loads(post.stdout)["findings"] if g["severity"] == "error"]
    assert [(g["kind"], g["ranks"], g["details"]["reason"]) for g in causes] == [
        ("hang", [0], "group_member_skipped")], post.stdout


def _salted(members, n):  # torch 2.13 and 2.15: the members and the rank's count
    return hashlib.sha1(f"{'_'.join(map(str, members))}_{n}".encode()).hexdigest()


def _chained(members, n):  # torch 2.4: hashed again once per group of them held
    h = hashlib.sha1("_".join(map(str, members)).encode()).hexdigest()
    for _ in range(n):
        h = hashlib.sha1(f"{h}_".encode()).hexdigest()
    return h


def _made(rank, index, name, ranks, line, done=True, failed=False):
    """The tracer's span around one group creation (tracer/groups.py)."""
    return Event(rank=rank, index=index, kind="span", op="span",
                 status="error" if failed else "ok" if done or failed else "in_flight",
                 group=name, group_desc="", group_ranks=tuple(ranks), seq=0, peer=None,
                 shapes=(), dtypes=(), device="", numel_in=0, numel_out=0, reduce_op=None,
                 callsite={"file": "/nonexistent/job.py", "line": line, "function": "<module>"},
                 t_enter_ns=0, t_end_ns=S // 1000 if done or failed else None, span_index=0,
                 name="new_group", error=None, is_async=False, other_thread=False,
                 implicit=True)


def _cause(engine):
    return [f for f in engine.findings() if f.details.get("reason") == "group_member_names"]


def test_torch_2_13_counts_the_groups_a_rank_is_a_member_of():
    """Every rank makes [0, 1] rightly (a counter name, line 10); ranks 0 and 1 are its
    members, 2 and 3 are not, so torch 2.13 names [0, 2] after 2 groups on rank 0 and 1 on
    rank 2. No rank condition and an even split: nobody is blamed (a tie). Inside for 6 s:
    a hang."""
    engine = Engine(hang_timeout_s=None)
    engine.ingest([_made(r, 0, "1", (0, 1), 10) for r in range(4)], 0.0)
    engine.ingest([_made(0, 1, _salted((0, 2), 2), (0, 2), 12, done=False),
                   _made(2, 1, _salted((0, 2), 1), (0, 2), 12, done=False)], 0.0)
    engine.tick(1.0)
    [f] = _cause(engine)
    assert f.kind == "mismatch" and f.ranks == [] and f.details["tie"], f.summary
    assert f.details["counted"] == "member", f.details
    assert [(n["ranks"], n["count"]) for n in f.details["names"]] == [([0], 2), ([2], 1)]
    assert "[0, 1] at job.py:10, which rank 2 also made but is not a member of" in f.summary
    assert "create it without use_local_synchronization=True" in f.remedy, f.remedy
    _said_hung_after_6_s(engine, 4, _cause)


def _said_hung_after_6_s(engine, world, cause):
    """Every rank still inside new_group 6 s on: the cause is said as a hang."""
    for r in range(world):
        engine.heartbeat(r, 6 * S, 6.0)
    engine.tick(6.0)
    [f] = cause(engine)
    assert f.kind == "hang" and f.summary.startswith("the job hangs because"), f.summary


def test_torch_2_15_counts_the_groups_a_rank_created():
    """Torch 2.15 salts with the groups the rank created: every rank makes [0, 1] (counted
    on all), then ranks 0 and 1 make it again by its members (line 11, counted on them
    only): [0, 2] is named after 3 on rank 0 and 2 on rank 2; read as 2.13's count (groups
    a rank is a member of) the counts would not be the names'."""
    engine = Engine(hang_timeout_s=None)
    engine.ingest([_made(r, 0, "1", (0, 1), 10) for r in range(4)], 0.0)
    engine.ingest([_made(r, 1, _salted((0, 1), 2), (0, 1), 11) for r in (0, 1)], 0.0)
    engine.ingest([_made(0, 2, _salted((0, 2), 3), (0, 2), 12, failed=True),
                   _made(2, 1, _salted((0, 2), 2), (0, 2), 12, failed=True)], 0.0)
    engine.tick(1.0)
    [f] = _cause(engine)
    assert f.details["counted"] == "created", f.details
    [e] = f.details["earlier"]
    assert (e["line"], e["counts"]) == (11, {"0": 1, "2": 0}), e
    assert "which ranks 0, 1 made and ranks 2, 3 did not" in f.summary, f.summary
    # not "create it without local synchronization": ranks 0, 1's own [0, 1] advanced the
    # counter that names a plain new_group() on them alone (torch 2.15), so that hangs too
    assert "make the earlier groups named above on every rank" in f.remedy, f.remedy
    assert "does not cure it alone" in f.remedy, f.remedy


def test_a_rank_dependent_creation_order_is_not_told_to_use_local_synchronization():
    """Counter name "1" stands for [0, 1] on rank 0 and [0, 2] on rank 2 (made in different
    orders): the remedy says every rank, same order, and that local synchronization does
    not help there (before: it recommended it, which names such groups apart)."""
    engine = Engine(hang_timeout_s=None)
    engine.ingest([_made(0, 0, "1", (0, 1), 10), _made(2, 0, "1", (0, 2), 11)], 0.0)
    engine.tick(1.0)
    [f] = [f for f in engine.findings() if f.details.get("reason") == "group_creation_order"]
    assert "no way out of a rank-dependent order" in f.remedy, f.remedy


def test_each_torchs_recipe_is_read_back_from_the_name():
    """The count in a name, by the recipe that gives it: 2.13's and 2.15's (the members and
    the count), 2.4's (hashed again per group of the same members); members in the order
    torch joined them (unsorted with sort_ranks=False); a name of no known recipe: None."""
    assert read_count(_salted((0, 2), 17), (0, 2)) == ("salted", 17)
    assert read_count(_chained((1, 3), 5), (1, 3)) == ("chained", 5)
    assert read_count(_salted((3, 1), 2), (3, 1)) == ("salted", 2)
    assert read_count(_salted((0, 2), 1), (0, 3)) is None
    assert read_count("default_pg", (0, 1)) is None


def test_names_of_no_known_recipe_still_split_and_the_majority_is_blamed():
    """Three members inside [0, 1, 2]: two give one name, rank 2 another."""
    engine = Engine(hang_timeout_s=None)
    engine.ingest([_made(r, 0, "a" * 40 if r < 2 else "b" * 40, (0, 1, 2), 10, done=False)
                   for r in range(3)], 0.0)
    engine.tick(1.0)
    [f] = _cause(engine)
    assert f.ranks == [2] and f.details["counted"] is None, f.details
    assert [n["count"] for n in f.details["names"]] == [None, None]


@pytest.mark.parametrize("case", ["ahead", "lost_and_behind", "done_apart_lost", "done_alike"])
def test_members_at_different_points_of_one_group_are_no_split(case):
    """ahead: rank 0 is inside its next group of [0, 2] while rank 2 is still done with the
    last one, whose name rank 0 gave too. lost_and_behind: rank 0's ring lost that last
    one (its log starts later), rank 2 is done with it, rank 0 inside the next: one done,
    one inside is never a split. done_apart_lost: both done, under names the other lacks,
    with fewer creations of [0, 2] on rank 0 (its ring lost the first). done_alike: both
    done with the same names. Against: both done apart with as many creations each (a
    backend that meets at the first collective) is a split."""
    old, new = _salted((0, 2), 1), _salted((0, 2), 2)
    ev = {"ahead": [_made(0, 0, old, (0, 2), 10), _made(0, 1, new, (0, 2), 11, done=False),
                    _made(2, 0, old, (0, 2), 10)],
          "lost_and_behind": [_made(0, 9, new, (0, 2), 11, done=False),
                              _made(2, 0, old, (0, 2), 10)],
          "done_apart_lost": [_made(0, 9, new, (0, 2), 11), _made(2, 0, old, (0, 2), 10),
                              _made(2, 1, _salted((0, 2), 3), (0, 2), 11)],
          "done_alike": [_made(r, i, _salted((0, 2), i + 1), (0, 2), 10) for r in (0, 2)
                         for i in range(12)]}[case]
    engine = Engine(hang_timeout_s=None)
    engine.ingest(ev, 0.0)
    engine.tick(1.0)
    assert _cause(engine) == [], [f.summary for f in _cause(engine)]
    engine = Engine(hang_timeout_s=None)
    engine.ingest([_made(0, 0, new, (0, 2), 11), _made(2, 0, old, (0, 2), 11)], 0.0)
    engine.tick(1.0)
    assert len(_cause(engine)) == 1


def _op(rank, index, seq, done, line=30):
    """An all_reduce on the default group of 4 ranks."""
    return Event(rank=rank, index=index, kind="collective", op="all_reduce",
                 status="ok" if done else "in_flight", group="0", group_desc="",
                 group_ranks=(0, 1, 2, 3), seq=seq, peer=None, shapes=((8,),),
                 dtypes=("float32",), device="cpu", numel_in=8, numel_out=8, reduce_op="sum",
                 callsite={"file": "/nonexistent/job.py", "line": line, "function": "<module>"},
                 t_enter_ns=S // 2, t_end_ns=S // 2 + 1000 if done else None, span_index=0,
                 name=None, error=None, is_async=False, other_thread=False)


def _skip_engine(rank3_waits: bool) -> Engine:
    """Rank 1 inside new_group([1, 3]); ranks 0, 2 (and 3) in all_reduce #1 for 5 s."""
    engine = Engine(hang_timeout_s=3)
    engine.ingest([_op(r, 0, 0, True) for r in range(4)], 0.0)
    engine.ingest([_made(1, 1, _salted((1, 3), 2), (1, 3), 20, done=False)]
                  + [_op(r, 1, 1, False, line=31) for r in ((0, 2, 3) if rank3_waits
                                                             else (0, 2))], 0.0)
    for r in range(4):
        engine.heartbeat(r, 5 * S, 5.0)
    engine.tick(5.0)
    return engine


def test_a_member_is_said_to_skip_a_member_named_group_only_where_it_cannot_come():
    """Rank 1 is inside new_group([1, 3]) (named by its members); ranks 0, 2 wait for it in
    all_reduce #1 past --hang-timeout 3. Rank 3, the other member, in no collective
    (computing, say): it may yet call it, so nothing says it skipped it, the hang stays a
    plain one. Rank 3 waiting in that all_reduce too, for rank 1: it never called the group
    and cannot come to it (said, with its line)."""
    engine = _skip_engine(rank3_waits=False)
    said = [f for f in engine.findings() if f.details.get("reason") == "group_member_skipped"]
    assert said == [] and any(f.kind == "hang" for f in engine.findings())
    engine = _skip_engine(rank3_waits=True)
    [f] = [f for f in engine.findings() if f.details.get("reason") == "group_member_skipped"]
    assert (f.kind, f.details["members"], f.details["never_created"]) == ("hang", [1, 3], [3])
    assert "rank 3 went on to all_reduce #1 in group 0 at job.py:31" in f.summary, f.summary
    assert f.ranks == [] and f.details["tie"], f.summary  # one each, no rank condition known


def _counter_cause(engine):
    return [f for f in engine.findings() if f.details.get("reason") == "group_counter_names"]


def _plain_after_member_named(plain_name):
    """3 ranks: 0 and 1 make [0, 1] by its members (line 10, inside `if rank < 2`), then
    all three call a plain new_group([0, 1, 2]) (line 12) and stay inside it.
    `plain_name(rank)`: the counter name torch gives it there."""
    engine = Engine(hang_timeout_s=None)
    engine.ingest([_made(r, 0, _salted((0, 1), 1), (0, 1), 10) for r in (0, 1)], 0.0)
    engine.ingest([_made(r, 1 if r < 2 else 0, plain_name(r), (0, 1, 2), 12, done=False)
                   for r in range(3)], 0.0)
    engine.tick(1.0)
    return engine


def test_torch_2_15_numbers_a_plain_group_after_a_member_named_one_apart():
    """Torch 2.15 advances the counter that names a plain group on every creation, also on
    one made by its members alone: ranks 0, 1 name the plain group "2", rank 2 names it "1",
    and all wait inside new_group. Said as that cause (the earlier creation, who made it,
    the counter); rank 2 is never said to have skipped it. Before: nothing at all while
    they were inside; a hang blaming them was said as a creation rank 2 "never called"."""
    engine = _plain_after_member_named(lambda r: "2" if r < 2 else "1")
    [f] = _counter_cause(engine)
    d = f.details
    assert f.kind == "mismatch" and f.ranks == [0, 1], (f.ranks, f.summary)
    assert d["members"] == [0, 1, 2] and d["counted"] == "created", d
    assert [(n["name"], n["ranks"]) for n in d["names"]] == [("2", [0, 1]), ("1", [2])], d
    [e] = d["earlier"]
    assert (e["members"], e["line"], e["counts"]) == ([0, 1], 10, {"0": 1, "2": 0}), e
    for words in ("ranks 0, 1 named it 2, rank 2 named it 1",
                  "[0, 1] at job.py:10, which ranks 0, 1 made and rank 2 did not"):
        assert words in f.summary, f.summary
    assert "group_desc does not name the group" in f.remedy, f.remedy
    assert not [g for g in engine.findings() if g.details.get("reason") in (
        "group_creation_skipped", "group_creation_order")], [g.summary for g in engine.findings()]
    _said_hung_after_6_s(engine, 3, _counter_cause)


def test_torch_2_13_numbers_only_plain_groups_and_the_same_program_is_quiet():
    """Torch 2.13 gives a member-named group no number: all three name the plain group
    "1" (the same program works there)."""
    engine = _plain_after_member_named(lambda r: "1")
    assert engine.findings() == [], [f.summary for f in engine.findings()]


@pytest.mark.timeout(60)
def test_a_plain_group_after_a_member_named_one_hangs_only_where_torch_numbers_both(tmp_path):
    """The real job, on the torch running the tests: after the healthy part, ranks 0, 1
    make [0, 1] by its members inside `if rank < 2`, then all four call a plain
    new_group([0, 1, 2, 3]). Torch 2.13 and 2.4 give the member-named group no number: the
    job ends, quiet. Torch 2.15 numbers it on ranks 0, 1 only: they name the plain group
    one past ranks 2, 3 and all wait inside new_group; said as that cause and stopped.
    Before (2.15): no finding, the job stopped only by a timeout."""
    run_dir = tmp_path / "run"
    proc = run_cli(["run", "--nproc", "4", "--run-dir", str(run_dir), "--grace", "2",
                    "--on-hang", "kill", "--", str(JOB), "plain"], timeout=45, run_dir=run_dir)
    findings = json.loads((run_dir / "findings.json").read_text())["findings"]
    described = "\n".join(f"{f['kind']} {f['ranks']} {f['summary']}" for f in findings)
    if proc.returncode == 0:  # this torch numbers plain groups only
        assert findings == [], described
        return
    assert "stopping the job (--on-hang kill)" in proc.stderr, described + proc.stderr[-2000:]
    [f] = findings
    marks = marker_sets(JOB)
    (local,), (plain,) = marks["local"], marks["plain"]
    d = f["details"]
    assert (f["kind"], f["ranks"], d["reason"]) == ("hang", [0, 1], "group_counter_names"), (
        described)
    assert [n["ranks"] for n in d["names"]] == [[0, 1], [2, 3]], d
    assert int(d["names"][0]["name"]) == int(d["names"][1]["name"]) + 1, d["names"]
    [e] = d["earlier"]
    assert (e["members"], e["line"], e["counts"]) == ([0, 1], local, {"0": 1, "2": 0}), e
    assert d["branch"]["condition"] == "rank < 2", d
    lines = {(c["rank"], c["line"]) for c in f["callsites"]}
    assert {(0, plain), (2, plain), (0, local)} <= lines, f["callsites"]
    for words in (f"member_names.py:{local}, which ranks 0, 1 made and ranks 2, 3 did not",
                  "`if rank < 2:`"):
        assert words in f["summary"], f["summary"]


def test_a_computing_member_read_twice_within_a_clock_tick_is_still_computing():
    """Rank 3 computes at a full core, read twice a second, then once more 5 ms after its
    last reading: no CPU tick in that newest interval. It is computing (active within the
    last second), so the ranks waiting inside a creation for it are no hang; by the newest
    interval alone it read as idle (a healthy job's late member called hung in a full run)."""
    from distdoctor.probes.progress import Reading

    engine = Engine(hang_timeout_s=None)
    engine.ingest([_op(3, 0, 0, done=True)], 1.0)
    cpu = 0.0
    for k in range(6):
        cpu = k / 2  # a full core
        engine.progress.add(3, Reading(100 + k / 2, cpu, 0.0, cpu, 0, "R"))
    engine.progress.add(3, Reading(100 + 2.5 + 0.005, cpu, 0.0, cpu, 0, "R"))
    assert engine._computing(3)
    engine.progress.add(3, Reading(100 + 4.0, cpu, 0.0, cpu, 0, "S"))  # then idle 1.5 s
    assert not engine._computing(3)
