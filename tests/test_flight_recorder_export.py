"""`distdoctor export --flight-recorder`: a run as PyTorch Flight Recorder dumps, checked
against the real thing.

Each job below runs under `distdoctor run` with the Flight Recorder on
(TORCH_FR_BUFFER_SIZE) and, half a second after it reaches its bug, dumps the recorder's own
trace on every rank (pickle and JSON), the way a timeout handler would (the hung job
is then stopped by `--on-hang kill`). The export of the
same run must agree with those dumps op by op where both record, and PyTorch's analyzer
(`python -m torch.distributed.flight_recorder.fr_trace DIR`, no flags) must reach the same
verdict on both.

gloo's recorder (torch 2.13) leaves pg_config empty, and the analyzer stops on that with a
KeyError; the job therefore writes its groups' ranks beside its dumps, and the analyzer
reads the recorder's dumps with pg_config filled in from them, as NCCL's recorder fills it.
"""

from __future__ import annotations

import json
import math
import pickle
import shutil
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import run_cli

from distdoctor.export.flight_recorder import FILE_PREFIX, FrExportStats, rank_dumps
from distdoctor.export.fr_analyzer import run_torchfrtrace_all
from distdoctor.runlog.reader import Event

pytestmark = pytest.mark.timeout(120)

JOB = textwrap.dedent('''\
    """MODE OUT: a few ops of each kind, then the bug (mismatch: the last rank broadcasts
    into a tensor of another shape; skip: the last rank never joins an all_reduce). Half
    a second later every rank dumps its Flight Recorder into OUT/fr and OUT/fr_json; then
    the mismatch job exits, and the hung one waits to be stopped by distdoctor."""
    import datetime, json, os, sys, threading, time
    import torch
    import torch.distributed as dist

    MODE, OUT = sys.argv[1], sys.argv[2]
    c10d = torch._C._distributed_c10d
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    pair = dist.new_group(list(range(world)), group_desc="pair")
    reached = threading.Event()


    def put(path, data):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path + ".tmp", "wb") as fh:
            fh.write(data)
        os.replace(path + ".tmp", path)


    def dump():
        reached.wait()
        time.sleep(0.5)
        stamp = time.time_ns()
        if not hasattr(c10d, "_dump_fr_trace"):  # a torch without a dump on demand
            put(f"{OUT}/unsupported", b"")
            os._exit(0)
        # the first dump with stacks sets up torch's symbolizer: seconds, too long for a
        # hung job that distdoctor stops at 3 s; its ops' lines are checked on the other
        stacks = MODE != "skip"
        put(f"{OUT}/fr/nccl_trace_rank_{rank}", c10d._dump_fr_trace(includeStackTraces=stacks))
        if hasattr(c10d, "_dump_fr_trace_json"):
            put(f"{OUT}/fr_json/nccl_trace_rank_{rank}.json", c10d._dump_fr_trace_json())
        groups = {g.group_name: [g.group_desc, dist.get_process_group_ranks(g)]
                  for g in (dist.group.WORLD, pair)}
        put(f"{OUT}/marks/{rank}.json", json.dumps({"dumped_ns": stamp,
                                                    "groups": groups}).encode())
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and len(os.listdir(f"{OUT}/marks")) < world:
            time.sleep(0.05)
        if MODE != "skip":
            os._exit(0)


    threading.Thread(target=dump, daemon=True).start()
    for step in range(2):
        dist.all_reduce(torch.ones(8))
        dist.broadcast(torch.ones(2, 3), src=step % world)
        dist.all_gather_into_tensor(torch.empty(world * 4), torch.ones(4))
        dist.all_to_all_single(torch.empty(world * 2), torch.ones(world * 2))
        dist.all_reduce(torch.ones(3, dtype=torch.float64), group=pair)
        if rank == 0:  # p2p: gloo's recorder keeps no p2p op; distdoctor's export does
            dist.send(torch.ones(5), 1)
        elif rank == 1:
            dist.recv(torch.empty(5), 0)
    dist.barrier()
    reached.set()
    if MODE == "skip":
        if rank == world - 1:
            time.sleep(60)
        try:
            dist.all_reduce(torch.ones(16))  # expect: waiting
        except RuntimeError:
            pass  # a peer that dumped first has exited
    elif MODE == "mismatch":
        buf = torch.ones(4, 5) if rank == world - 1 else torch.ones(4, 4)
        dist.broadcast(buf, src=0)  # expect: mismatch
    time.sleep(60)
''')
# what the two dumps must agree on, entry by entry
SAME = ("process_group", "collective_seq_id", "profiling_name", "input_sizes", "output_sizes",
        "input_dtypes", "output_dtypes")


def _line(marker: str) -> int:
    return next(no for no, text in enumerate(JOB.splitlines(), start=1)
                if f"# expect: {marker}" in text)


def _job(tmp: Path, mode: str) -> dict:
    job, out, run_dir = tmp / "fr_job.py", tmp / "out", tmp / "run"
    job.write_text(JOB)
    proc = run_cli(["run", "--nproc", "2", "--run-dir", str(run_dir), "--grace", "2",
                    "--hang-timeout", "3", "--on-hang", "kill", "--", str(job), mode, str(out)],
                   timeout=90, run_dir=run_dir, env={"TORCH_FR_BUFFER_SIZE": "2000"})
    if (out / "unsupported").exists():
        pytest.skip("this torch cannot dump its Flight Recorder on demand")
    assert (proc.returncode == 0) == (mode != "skip"), proc.stderr[-3000:]
    marks = [json.loads((out / "marks" / f"{r}.json").read_text()) for r in range(2)]
    ours = tmp / "ours"
    res = run_cli(["export", str(run_dir), "--flight-recorder", str(ours)], timeout=60)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    assert sorted(p.name for p in ours.iterdir()) == [f"{FILE_PREFIX}{r}" for r in range(2)]
    # the recorder's own dumps, with the groups gloo's recorder leaves out
    theirs = tmp / "theirs"
    theirs.mkdir()
    for r in range(2):
        d = pickle.loads((out / "fr" / f"{FILE_PREFIX}{r}").read_bytes())
        d["pg_config"] = {name: {"name": name, "desc": desc, "ranks": str(ranks)}
                          for name, (desc, ranks) in marks[r]["groups"].items()}
        (theirs / f"{FILE_PREFIX}{r}").write_bytes(pickle.dumps(d))
    diag = run_cli(["diagnose", str(run_dir), "--json"], timeout=60)
    return {"run": run_dir, "out": out, "ours": ours, "theirs": theirs, "marks": marks,
            "findings": json.loads(diag.stdout)["findings"]}


@pytest.fixture(scope="module")
def mismatch(tmp_path_factory):
    return _job(tmp_path_factory.mktemp("fr_mismatch"), "mismatch")


@pytest.fixture(scope="module")
def skip(tmp_path_factory):
    return _job(tmp_path_factory.mktemp("fr_skip"), "skip")


def _load(folder: Path, rank: int, suffix: str = "") -> dict:
    data = (folder / f"{FILE_PREFIX}{rank}{suffix}").read_bytes()
    return json.loads(data) if suffix else pickle.loads(data)


def _user_line(entry: dict) -> int | None:
    return next((f["line"] for f in entry.get("frames", ()) if f["filename"].endswith(
        "fr_job.py")), None)


def test_export_agrees_with_the_recorders_own_dump_op_by_op(mismatch):
    for rank in range(2):
        theirs = _load(mismatch["out"] / "fr", rank)
        ours = _load(mismatch["ours"], rank)
        assert ours["version"] == theirs["version"]
        assert set(ours) == set(theirs) and set(ours["entries"][0]) == set(
            theirs["entries"][0]) | {"duration_ms"}
        kept = [e for e in ours["entries"] if not e["is_p2p"]]  # what gloo's recorder keeps
        assert ([e["profiling_name"] for e in kept]
                == [e["profiling_name"] for e in theirs["entries"]])
        dumped = mismatch["marks"][rank]["dumped_ns"]
        for us, them in zip(kept, theirs["entries"], strict=True):
            assert {k: us[k] for k in SAME} == {k: them[k] for k in SAME}, (us, them)
            # finished when the recorder was dumped, on both (gloo's says so by `retired`)
            finished = us["state"] == "completed" and us["time_discovered_completed_ns"] < dumped
            assert finished == them["retired"], (us, them)
            assert _user_line(us) == _user_line(them) is not None
            # one clock: the wall clock, within a second (not a monotonic reading)
            assert abs(us["time_created_ns"] - them["time_created_ns"]) < 1e9
        # the p2p ops the recorder does not keep, with their peers in NCCL's notation
        p2p = [e["profiling_name"] for e in ours["entries"] if e["is_p2p"]]
        assert p2p == (["gloo:send 0->1"] * 2 if rank == 0 else ["gloo:recv 1<-0"] * 2)
        # the groups, as NCCL's recorder records them (gloo's records none)
        assert {g: (c["desc"], json.loads(c["ranks"])) for g, c in ours["pg_config"].items()} \
            == {g: tuple(v) for g, v in mismatch["marks"][rank]["groups"].items()}


def test_json_variant_has_the_recorders_layout(mismatch, tmp_path):
    res = run_cli(["export", str(mismatch["run"]), "--flight-recorder", str(tmp_path / "j"),
                   "--fr-format", "json"], timeout=60)
    assert res.returncode == 0, res.stderr
    theirs = _load(mismatch["out"] / "fr_json", 0, ".json")
    ours = _load(tmp_path / "j", 0, ".json")
    assert set(ours) == set(theirs) and ours["version"] == theirs["version"]
    assert set(ours["entries"][0]) == set(theirs["entries"][0]) | {"duration_ms"}
    kept = [e for e in ours["entries"] if not e["is_p2p"]]
    for us, them in zip(kept, theirs["entries"], strict=True):
        assert {k: us[k] for k in SAME} == {k: them[k] for k in SAME}
    assert all(isinstance(v, str) for st in ours["pg_status"].values() for v in st.values())
    # distdoctor reads its own JSON export back to the same finding as the run (a dump
    # numbers collectives from 1, the run from 0)
    back = run_cli(["diagnose", "--fr-dump", str(tmp_path / "j"), "--json"], timeout=60)
    errors = [(f["kind"], f["ranks"], f["seq"] - 1) for f in json.loads(back.stdout)[
        "findings"] if f["severity"] == "error"]
    assert errors == [(f["kind"], f["ranks"], f["seq"]) for f in mismatch["findings"]
                      if f["severity"] == "error"]


def test_torchfrtrace_names_the_same_mismatch_on_both(mismatch):
    ours, theirs = run_torchfrtrace_all([mismatch["ours"], mismatch["theirs"]])
    assert ours.kind == "mismatch", ours.output
    assert (ours.kind, ours.ranks, ours.seq, ours.group, ours.op, ours.error) == (
        theirs.kind, theirs.ranks, theirs.seq, theirs.group, theirs.op, theirs.error), (
        ours.output, theirs.output)
    assert ours.op == "gloo:broadcast" and ours.error == "SIZE_OR_SYNTAX_MISMATCH"
    assert ours.frames[-1][2] == _line("mismatch")
    # distdoctor's own verdict on the run: the same op (its seq counts from 0)
    [f] = [f for f in mismatch["findings"] if f["severity"] == "error"]
    assert (f["kind"], f["group"], f["seq"] + 1) == ("mismatch", "0", ours.seq)


def test_torchfrtrace_names_the_same_missing_rank_on_both(skip):
    ours, theirs = run_torchfrtrace_all([skip["ours"], skip["theirs"]])
    assert (ours.kind, ours.ranks, ours.op) == ("missing_ranks", (1,), "gloo:all_reduce"), \
        ours.output
    assert (ours.kind, ours.ranks, ours.seq, ours.group, ours.op) == (
        theirs.kind, theirs.ranks, theirs.seq, theirs.group, theirs.op), theirs.output
    assert ours.frames[-1][2] == _line("waiting")
    [f] = [f for f in skip["findings"] if f["severity"] == "error"]
    assert (f["kind"], f["ranks"], f["group"], f["seq"] + 1) == ("hang", [1], "0", ours.seq)


def test_export_needs_exactly_one_destination_and_a_folder_of_its_own(mismatch, tmp_path):
    run_dir = str(mismatch["run"])
    for args, says in ((["export", run_dir], "one of the arguments --perfetto "
                        "--flight-recorder is required"),
                       (["export", run_dir, "--perfetto", str(tmp_path / "t.json"),
                         "--flight-recorder", str(tmp_path / "fr")], "not allowed with"),
                       (["export", run_dir, "--perfetto", str(tmp_path / "t.json"),
                         "--fr-format", "json"], "--fr-format goes with --flight-recorder")):
        res = run_cli(args, timeout=60)
        assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
        assert says in res.stderr
    # torchfrtrace reads every file in the folder as a dump: a foreign file is refused
    folder = tmp_path / "busy"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine\n")
    res = run_cli(["export", run_dir, "--flight-recorder", str(folder)], timeout=60)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "notes.txt" in res.stderr and sorted(p.name for p in folder.iterdir()) == [
        "notes.txt"]
    # an earlier export is replaced whole: pickles give way to JSON, none left behind
    again = tmp_path / "again"
    shutil.copytree(mismatch["ours"], again)
    res = run_cli(["export", run_dir, "--flight-recorder", str(again), "--fr-format", "json"],
                  timeout=60)
    assert res.returncode == 0, res.stderr
    assert sorted(p.name for p in again.iterdir()) == [f"{FILE_PREFIX}{r}.json" for r in range(2)]


# --- an NCCL run's export, built from events (no GPU here) ------------------------------
def _event(rank: int, index: int, op: str, seq: int = 0, peer: int | None = None,
           shapes=((4,),), numel_out: int | None = None, t: int = 0, end: int | None = 10,
           kind: str = "collective") -> Event:
    numel = sum(math.prod(s) for s in shapes)
    return Event(rank=rank, index=index, kind=kind, op=op, status="ok" if end else "in_flight",
                 group="0", group_desc="default_pg", group_ranks=(0, 1), seq=seq, peer=peer,
                 shapes=tuple(shapes), dtypes=("bfloat16",) * len(shapes), device="cuda:0",
                 numel_in=numel, numel_out=numel if numel_out is None else numel_out,
                 reduce_op=None, callsite={"file": "/job/train.py", "line": 10 + index,
                                           "function": "step"},
                 t_enter_ns=1_000 + t, t_end_ns=None if end is None else 1_000 + t + end,
                 span_index=0, name=None, error=None, is_async=None, other_thread=False)


def test_an_nccl_run_is_written_in_nccls_names_and_layouts():
    types = pytest.importorskip("torch.distributed.flight_recorder.components.types")
    events = {}
    for r in range(2):
        peer = 1 - r
        events[r] = [
            _event(r, 0, "all_gather_into_tensor", 0, numel_out=8, t=0),
            _event(r, 1, "reduce_scatter_tensor", 1, shapes=((8,),), numel_out=4, t=100),
            _event(r, 2, "barrier", 2, shapes=(), t=200),
            # a batch: the recv is entered before the send returns (batch_isend_irecv)
            _event(r, 3, "send", 0, peer=peer, t=300, end=50, kind="p2p"),
            _event(r, 4, "recv", 0, peer=peer, t=310, end=50, kind="p2p"),
            _event(r, 5, "recv_anysource", 1, peer=-1, t=400, kind="p2p"),
            _event(r, 6, "all_reduce_coalesced", 3, shapes=((2,), (3,)), t=500, end=None)]
    run = SimpleNamespace(events=events, headers={}, world_size=2,
                          meta={r: {"backend": "nccl", "host": "h"} for r in range(2)})
    stats = FrExportStats()
    dumps = rank_dumps(run, stats)
    es = dumps[0]["entries"]
    assert [e["profiling_name"] for e in es] == [
        "nccl:_all_gather_base", "nccl:_reduce_scatter_base", "nccl:all_reduce_barrier",
        "nccl:send 0->1", "nccl:recv 0<-1", "nccl:coalesced", "nccl:allreduce_coalesced"]
    assert stats.left_out == {"recv_anysource": 2}  # no peer: nothing can pair it
    assert (es[0]["output_sizes"], es[1]["output_sizes"]) == ([[8]], [[4]])
    assert es[0]["input_dtypes"] == ["BFloat16"]
    # one batch: one p2p_seq_id, the collective's seq beside it, closed by the marker
    assert {e["p2p_seq_id"] for e in es[3:6]} == {1} and es[5]["is_p2p"]
    assert [e["collective_seq_id"] for e in es] == [1, 2, 3, 3, 3, 3, 4]
    assert es[-1]["state"] == "started" and not es[-1]["retired"]
    assert dumps[0]["pg_status"]["0"]["last_completed_collective"] == 3
    # every name is one torch's analyzer parses (it stops on any other)
    known = types.COLLECTIVES | types.P2P | {"coalesced"}
    assert {e["profiling_name"].split(":")[1].split(" ")[0] for e in es} <= known
