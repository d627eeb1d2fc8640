"""`distdoctor diagnose --fr-dump`: PyTorch Flight Recorder dumps in, findings out.

Real gloo jobs write real dumps (tests/jobs/fr_dump.py); dumps in NCCL's shape (p2p, group
ranks, coalesced ops, a full ring), which a CPU machine cannot produce, are built here
from the fields PyTorch's own analyzer reads.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import JOBS, marker_lines, own_sites, run_cli, run_ranks_bare

from distdoctor.diagnosis.flight_recorder.dumps import load_fr_dumps
from distdoctor.diagnosis.postmortem import diagnose_events
from distdoctor.errors import UserError

JOB = "fr_dump.py"


# --- real gloo jobs -------------------------------------------------------------------
def _run_fr_job(mode: str, prefix: Path, nproc: int = 3, fmt: str = "pickle",
                timeout: float = 60) -> None:
    """Launch the ranks torchrun-style and wait; kill every one of them on a timeout."""
    env = dict(os.environ, TORCH_FR_BUFFER_SIZE="2000", PYTHONUNBUFFERED="1")
    argv = [sys.executable, str(JOBS / JOB), mode, str(prefix)] + (["json"] if fmt == "json"
                                                                   else [])
    run_ranks_bare(argv, env, nproc, timeout, f"{JOB} {mode}")


def _diagnose(prefix) -> tuple[int, dict]:
    proc = run_cli(["diagnose", "--fr-dump", str(prefix), "--json"], timeout=60)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def _errors(report: dict) -> list[dict]:
    return [f for f in report["findings"] if f["severity"] == "error"]


@pytest.mark.timeout(120)
def test_rank_that_skipped_a_collective_is_named_from_real_gloo_dumps(tmp_path):
    prefix = tmp_path / "nccl_trace_rank_"  # PyTorch's default file names
    _run_fr_job("skip", prefix)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"nccl_trace_rank_{r}"
                                                          for r in range(3)]
    rc, report = _diagnose(prefix)
    assert rc == 1
    [f] = _errors(report)
    assert f["kind"] == "hang" and f["ranks"] == [2], f
    assert f["group"] == "0" and f["details"]["waiting_ranks"] == [0, 1]
    # the culprit's last op (it is stuck after it) and where the others wait
    lines = marker_lines(JOB)
    by_rank = own_sites(f)
    assert by_rank[2]["line"] == lines["last"] and by_rank[2]["file"].endswith(JOB)
    assert by_rank[0]["line"] == lines["waiting"]


@pytest.mark.timeout(120)
def test_mismatched_shape_is_named_from_real_gloo_json_dumps(tmp_path):
    prefix = tmp_path / "fr_"
    _run_fr_job("mismatch", prefix, fmt="json")
    rc, report = _diagnose(prefix)
    assert rc == 1
    [f] = _errors(report)
    assert f["kind"] == "mismatch" and f["ranks"] == [2], f
    assert f["details"]["differs_in"] == ["numel"]
    shapes = {tuple(v["ranks"]): v["shapes"] for v in f["details"]["variants"]}
    assert shapes == {(0, 1): [[4, 4]], (2,): [[4, 5]]}
    assert report["notes"] == []


@pytest.mark.timeout(120)
def test_healthy_real_dumps_have_no_findings(tmp_path):
    _run_fr_job("healthy", tmp_path / "fr_", nproc=2)
    rc, report = _diagnose(tmp_path)  # a directory of dumps works as the prefix too
    assert rc == 0 and report["findings"] == [] and report["notes"] == []
    dumps = load_fr_dumps(str(tmp_path / "fr_"))
    assert dumps.world_size == 2 and not dumps.unreadable
    ops = [e.op for e in dumps.events[0]]
    assert ops[:3] == ["all_reduce", "broadcast", "all_gather"] and ops[-1] == "barrier"
    assert all(e.status == "ok" and e.callsite["file"].endswith(JOB)
               for e in dumps.events[0])


# --- dumps built here ----------------------------------------------------------------
T0 = 1_700_000_000_000_000_000


def entry(rid: int, seq: int, name: str = "all_reduce", sizes=((4,),), done: bool = True,
          pg=("0", "default_pg"), p2p_seq: int = 0, line: int = 10, backend: str = "nccl"):
    is_p2p = name.split(" ")[0] in ("send", "recv")
    return {"record_id": rid, "pg_id": 0, "process_group": pg, "collective_seq_id": seq,
            "p2p_seq_id": p2p_seq, "op_id": rid + 1, "profiling_name": f"{backend}:{name}",
            "time_created_ns": T0 + rid * 1_000_000, "input_sizes": [list(s) for s in sizes],
            "input_dtypes": ["Float"] * len(sizes), "output_sizes": [list(s) for s in sizes],
            "output_dtypes": ["Float"] * len(sizes),
            "state": "completed" if done else "started",
            "time_discovered_started_ns": T0 + rid * 1_000_000 + 10,
            "time_discovered_completed_ns": T0 + rid * 1_000_000 + 500 if done else None,
            "retired": done, "timeout_ms": 600_000, "is_p2p": is_p2p,
            "frames": [{"name": "all_reduce", "line": 2800, "filename":
                        "/usr/lib/python3/site-packages/torch/distributed/distributed_c10d.py"},
                       {"name": "step", "filename": "/job/train.py", "line": line}]}


def dump(entries, world: int | None = None) -> dict:
    cfg = {"0": {"name": "0", "desc": "default_pg", "ranks": str(list(range(world)))}} \
        if world else {"": {"name": "", "desc": "", "ranks": "[]"}}
    return {"version": "2.10", "pg_config": cfg, "pg_status": {}, "comm_lib_version": "",
            "entries": entries}


def write(prefix: Path, rank: int, d: dict, fmt: str = "pickle") -> Path:
    path = Path(f"{prefix}{rank}{'.json' if fmt == 'json' else ''}")
    path.write_bytes(json.dumps(d).encode() if fmt == "json" else pickle.dumps(d, protocol=2))
    return path


def findings(prefix) -> list:
    d = load_fr_dumps(str(prefix))
    return diagnose_events(d.events, d.headers(), {}, 0.0, members_per_op=True).findings()


def three_ranks_one_skips(prefix: Path, fmt: str = "pickle") -> None:
    """Ranks 0 and 1 wait in all_reduce #3; rank 2 stopped after #2."""
    for r in range(3):
        es = [entry(0, 1), entry(1, 2)] + ([entry(2, 3, done=False, line=20)] if r < 2 else [])
        write(prefix, r, dump(es), fmt)


def test_constructed_hang_names_the_rank_absent_from_the_pending_collective(tmp_path):
    three_ranks_one_skips(tmp_path / "fr_", fmt="json")
    [f] = findings(tmp_path / "fr_")
    assert (f.kind, f.ranks, f.seq) == ("hang", [2], 3)
    assert {c["rank"]: c["line"] for c in f.callsites} == {2: 10, 0: 20}


def test_malicious_pickle_is_refused_not_run(tmp_path):
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    prefix = tmp_path / "fr_"
    write(prefix, 0, dump([entry(0, 1)]))
    (tmp_path / "fr_1").write_bytes(pickle.dumps({"version": "2.10", "entries": [Evil()]}))
    d = load_fr_dumps(str(prefix))
    assert not marker.exists()
    assert "refused to load" in d.unreadable[1] and "system" in d.unreadable[1]
    assert [e.op for e in d.events[0]] == ["all_reduce"]
    rc, report = _diagnose(prefix)
    assert not marker.exists() and rc == 0
    assert [n for n in report["notes"] if n.startswith("rank 1: ") and "refused" in n]


def test_truncated_dump_is_a_note_and_the_others_are_still_diagnosed(tmp_path):
    prefix = tmp_path / "fr_"
    three_ranks_one_skips(prefix)
    good = (tmp_path / "fr_1").read_bytes()
    (tmp_path / "fr_1").write_bytes(good[: len(good) // 2])
    d = load_fr_dumps(str(prefix))
    assert "truncated" in d.unreadable[1] and sorted(d.events) == [0, 2]
    # rank 1 wrote a dump, so it was alive: unknown, not blamed; rank 2 still is
    [f] = findings(prefix)
    assert (f.kind, f.ranks) == ("hang", [2])
    rc, report = _diagnose(prefix)
    assert rc == 1 and any(n.startswith("rank 1: ") for n in report["notes"])


def test_missing_or_foreign_dumps_exit_2_in_one_line(tmp_path):
    proc = run_cli(["diagnose", "--fr-dump", str(tmp_path / "nope_")], timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "no Flight Recorder dumps" in proc.stderr
    (tmp_path / "fr_0").write_text("hello, not a dump\n")
    (tmp_path / "fr_1").write_bytes(pickle.dumps([1, 2, 3]))
    proc = run_cli(["diagnose", "--fr-dump", str(tmp_path / "fr_")], timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "not a Flight Recorder dump" in proc.stderr


def test_healthy_constructed_dumps_have_no_findings(tmp_path):
    for r in range(4):
        write(tmp_path / "fr_", r, dump([entry(i, i + 1) for i in range(20)], world=4))
    assert findings(tmp_path / "fr_") == []


def test_rank_without_a_dump_is_the_suspect_when_the_others_wait(tmp_path):
    # NCCL dumps carry the group's ranks: rank 2 is known to exist though it left no dump
    for r in range(2):
        write(tmp_path / "fr_", r, dump([entry(0, 1), entry(1, 2, done=False)], world=3))
    d = load_fr_dumps(str(tmp_path / "fr_"))
    assert d.world_size == 3 and "no Flight Recorder dump" in d.unreadable[2]
    [f] = findings(tmp_path / "fr_")
    assert (f.kind, f.ranks, f.seq) == ("hang", [2], 2)


def test_p2p_pairs_per_peer_hang_and_deadlock(tmp_path):
    # rank 1 waits to receive from rank 0, which is computing: a hang naming rank 0
    write(tmp_path / "a_", 0, dump([entry(0, 1), entry(1, 1, "send 0->1", p2p_seq=1)], 2))
    write(tmp_path / "a_", 1, dump([entry(0, 1), entry(1, 1, "recv 1<-0", p2p_seq=1),
                                    entry(2, 1, "recv 1<-0", p2p_seq=2, done=False)], 2))
    [f] = findings(tmp_path / "a_")
    assert (f.kind, f.ranks, f.seq) == ("hang", [0], 1) and "recv" in f.summary
    # both ranks send first and block: a deadlock naming both
    write(tmp_path / "b_", 0, dump([entry(0, 1, "send 0->1", p2p_seq=1, done=False)], 2))
    write(tmp_path / "b_", 1, dump([entry(0, 1, "send 1->0", p2p_seq=1, done=False)], 2))
    [f] = findings(tmp_path / "b_")
    assert (f.kind, f.ranks) == ("deadlock", [0, 1])


def test_coalesced_entries_are_one_op(tmp_path):
    for r in range(2):
        es = [entry(0, 1, sizes=((4,),), done=False), entry(1, 1, sizes=((2, 3),), done=False),
              entry(2, 1, "coalesced", sizes=())]
        write(tmp_path / "fr_", r, dump(es, world=2))
    d = load_fr_dumps(str(tmp_path / "fr_"))
    [ev] = d.events[0]
    assert (ev.op, ev.status, ev.numel_in, ev.shapes) == ("all_reduce_coalesced", "ok", 10,
                                                           ((4,), (2, 3)))
    assert findings(tmp_path / "fr_") == []


def test_a_full_ring_is_no_hang(tmp_path):
    # rank 0's buffer wrapped (its first record is #5): it cannot tell about #1 to #5
    write(tmp_path / "fr_", 0, dump([entry(i, i + 1) for i in range(5, 10)], world=2))
    write(tmp_path / "fr_", 1, dump([entry(i, i + 1) for i in range(10)], world=2))
    assert findings(tmp_path / "fr_") == []


@pytest.mark.parametrize("names", [["x3.json", "x10.json"], ["fr_trace_3", "fr_trace_10"],
                                   ["p3.pkl", "p10.pkl"]])
def test_file_names(tmp_path, names):
    for name, rank in zip(names, (3, 10), strict=True):
        stem = name.split(str(rank))[0]
        path = write(tmp_path / stem, rank, dump([entry(0, 1)]))
        path.rename(tmp_path / name)
    stem = names[0].split("3")[0]
    assert sorted(load_fr_dumps(str(tmp_path / stem)).events) == [3, 10]
    assert sorted(load_fr_dumps(str(tmp_path)).events) == [3, 10]


def test_two_dumps_of_one_rank_are_refused(tmp_path):
    write(tmp_path / "fr_", 0, dump([entry(0, 1)]))
    write(tmp_path / "fr_", 0, dump([entry(0, 1)]), fmt="json")
    with pytest.raises(UserError, match="two dumps of rank 0"):
        load_fr_dumps(str(tmp_path / "fr_"))


def test_a_newer_format_is_named_not_misread(tmp_path):
    write(tmp_path / "fr_", 0, dump([entry(0, 1)]))
    write(tmp_path / "fr_", 1, dict(dump([entry(0, 1)]), version="3.0"))
    d = load_fr_dumps(str(tmp_path / "fr_"))
    assert "format 3.0" in d.unreadable[1] and "upgrade distdoctor" in d.unreadable[1]
    assert sorted(d.events) == [0]


def test_nccl2_dumps_of_torch_215_name_the_stuck_rank():
    # tests/fixtures/fr_nccl2/README.md: torch 2.15.0's JSON dump format, as its
    # FlightRecorderHook writes for nccl2 ("nccl2:all_reduce", the hung op "scheduled")
    prefix = Path(__file__).parent / "fixtures" / "fr_nccl2" / "nccl_trace_rank_"
    d = load_fr_dumps(str(prefix))
    assert d.world_size == 4 and not d.unreadable
    assert {e.op for es in d.events.values() for e in es} == {"all_reduce"}
    rc, report = _diagnose(prefix)
    assert rc == 1
    [f] = _errors(report)
    assert f["kind"] == "hang" and f["ranks"] == [2] and f["group"] == "0", f
    assert f["details"]["waiting_ranks"] == [0, 1, 3], f


@pytest.mark.timeout(120)
def test_numbers_past_any_world_in_names_and_groups_are_no_ranks(tmp_path):
    """A dump's rank is read from its file name and the world from its default group's
    member list: a stray file named with a stamp (`fr_99999999999`) and a group record of
    a trillion ranks made `diagnose --fr-dump` count every rank below to say which left no
    dump (minutes, then the machine's memory). Neither is a job's: the two real dumps are
    diagnosed, and a world of 200 ranks with 198 dumps missing is one note, not 198."""
    for r in range(2):
        write(tmp_path / "fr_", r, dump([entry(0, 1), entry(1, 2, done=False)], world=2))
    write(tmp_path / "fr_", 99_999_999_999, dump([entry(0, 1)], world=2))
    huge = dict(dump([entry(0, 1)], world=2))
    huge["pg_config"] = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 10" + "0" * 11
                               + "]"}}
    write(tmp_path / "fr_", 1, huge, fmt="json")
    (tmp_path / "fr_1").unlink()  # (rank 1's pickle: its JSON twin holds the huge group)
    # read in a child with 3 GB of address space: a regression fails it, not the machine
    code = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))\n"
            "from distdoctor.diagnosis.flight_recorder.dumps import load_fr_dumps\n"
            "d = load_fr_dumps(sys.argv[1])\n"
            "print(sorted(d.files), d.world_size, sorted(d.unreadable))")
    child = subprocess.run([sys.executable, "-c", code, str(tmp_path / "fr_")],
                           capture_output=True, text=True, timeout=60)
    assert child.stdout.strip() == "[0, 1] 2 []", child.stdout + child.stderr[-2000:]
    many = tmp_path / "many"
    many.mkdir()
    for r in range(2):
        write(many / "fr_", r, dump([entry(0, 1), entry(1, 2, done=False)], world=200))
    proc = run_cli(["diagnose", "--fr-dump", str(many / "fr_")], timeout=60)
    assert "Traceback" not in proc.stderr, proc.stderr
    said = " ".join((proc.stdout + proc.stderr).split())  # (the report wraps its lines)
    assert said.count("no Flight Recorder dump") == 1, said
    assert "198 ranks have no Flight Recorder dump" in said and "(ranks 2-199:" in said, said


def test_times_and_durations_past_any_clock_are_no_measurement(tmp_path):
    """A dump's numbers that no conversion can hold (JSON's Infinity for a time, a duration
    of 1e308 ms) cost their entry or their measurement, not the diagnosis. Before: "cannot
    convert float infinity to integer" stopped diagnose --fr-dump (a bug in distdoctor)."""
    es = [entry(0, 1), entry(1, 2, done=False)]
    es[0]["duration_ms"] = 1e308
    write(tmp_path / "fr_", 0, dump(es, world=2), fmt="json")
    odd = [entry(0, 1), entry(1, 2, done=False)]
    odd[0]["time_discovered_completed_ns"] = float("inf")
    odd.insert(0, dict(entry(0, 1), time_created_ns=float("inf"), record_id=0))
    write(tmp_path / "fr_", 1, dump(odd, world=2), fmt="json")
    assert "Infinity" in (tmp_path / "fr_1.json").read_text()
    code, report = _diagnose(tmp_path / "fr_")
    assert code in (0, 1) and "a bug in distdoctor" not in json.dumps(report), report
    d = load_fr_dumps(str(tmp_path / "fr_"))
    assert sorted(d.events) == [0, 1] and not d.unreadable, d.unreadable
