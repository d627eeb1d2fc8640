"""`distdoctor export RUN_DIR --perfetto FILE`: a real 2-rank gloo job (spans, a sub-group,
async and batched p2p ops, then a hang) exported to Chrome Trace Event JSON, checked the way
Perfetto's importer reads it; plus the clock alignment and lanes on constructed runs, and
bad input."""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict

import pytest
from conftest import run_cli

from distdoctor.export.perfetto import rank_ranges, write_perfetto
from distdoctor.findings import Finding
from distdoctor.runlog.reader import Event, RingHeader
from distdoctor.runlog.run import Run, read_run
from distdoctor.runlog.rundir import RunInfo

JOB = '''"""Two ranks: spans, a sub-group, async and batched p2p ops; then rank 1 never joins."""
import datetime
import time

import torch
import torch.distributed as dist

import distdoctor

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=120))
rank = dist.get_rank()
peer = 1 - rank
pair = dist.new_group([0, 1])
for step in range(3):
    with distdoctor.trace(f"step {step}"):
        dist.all_reduce(torch.ones(4))  # expect: all_reduce
        dist.broadcast(torch.ones(2), src=0, group=pair)  # expect: broadcast
        dist.all_reduce(torch.ones(8), async_op=True).wait()  # expect: async
ops = [dist.P2POp(dist.isend, torch.ones(3), peer), dist.P2POp(dist.irecv, torch.empty(3), peer)]
for work in dist.batch_isend_irecv(ops):
    work.wait()
if rank == 1:
    while True:  # never joins the last all_reduce
        time.sleep(0.01)
dist.all_reduce(torch.ones(4))  # expect: hung
'''
LINE = {m: n for n, text in enumerate(JOB.splitlines(), start=1)
        for m in re.findall(r"# expect: (\w+)", text)}
WROTE = re.compile(r"^wrote (\d+) slices, (\d+) findings for (\d+) ranks to (.+) "
                   r"\(open in https://ui\.perfetto\.dev\)$")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    base = tmp_path_factory.mktemp("export")
    job, run_dir, out = base / "job.py", base / "run", base / "trace.json"
    job.write_text(JOB)
    res = run_cli(["run", "--nproc", "2", "--run-dir", str(run_dir), "--grace", "2",
                   "--hang-timeout", "3", "--on-hang", "kill", "--", str(job)],
                  timeout=90, run_dir=run_dir)
    assert res.returncode != 0 and "HANG" in res.stderr, res.stderr
    res = run_cli(["export", str(run_dir), "--perfetto", str(out)], timeout=60)
    assert res.returncode == 0, res.stderr
    return run_dir, out, res.stdout, json.loads(out.read_text(encoding="utf-8"))


def _threads(trace) -> dict[tuple[int, int], str]:
    return {(e["pid"], e["tid"]): e["args"]["name"] for e in trace["traceEvents"]
            if e["ph"] == "M" and e["name"] == "thread_name"}


def _slices(trace, cat=None) -> list[dict]:
    return [e for e in trace["traceEvents"]
            if e["ph"] == "X" and (cat is None or e["cat"] in cat)]


@pytest.mark.timeout(150)
def test_summary_line_and_file_shape(exported):
    _, out, stdout, trace = exported
    lines = stdout.strip().splitlines()
    assert len(lines) == 1, stdout
    m = WROTE.match(lines[0])
    assert m, lines[0]
    slices, findings, ranks, where = int(m[1]), int(m[2]), int(m[3]), m[4]
    assert (ranks, where) == (2, str(out))
    assert slices == len(_slices(trace))
    instants = [e for e in trace["traceEvents"] if e["ph"] == "i"]
    assert findings == len({e["args"]["summary"] for e in instants}) >= 1
    # what Perfetto's streaming importer needs: displayTimeUnit first, traceEvents last,
    # and "ph", "ts" leading every event (it reads ts before any other value)
    text = out.read_text(encoding="utf-8")
    assert text.startswith('{"displayTimeUnit":"ms"')
    assert list(trace)[-1] == "traceEvents"
    for e in trace["traceEvents"]:
        assert list(e)[:2] == ["ph", "ts"], e
    assert not list(out.parent.glob(".trace.json.*"))  # the temporary file is gone


@pytest.mark.timeout(150)
def test_one_process_per_rank_and_one_track_per_group(exported):
    run_dir, _, _, trace = exported
    run = read_run(run_dir)
    procs = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"]
             if e["ph"] == "M" and e["name"] == "process_name"}
    host = run.info.ranks[0]["host"]
    assert procs == {0: f"rank 0 ({host})", 1: f"rank 1 ({host})"}
    threads = _threads(trace)
    tids = [tid for (_, tid) in threads]
    assert len(set(tids)) == len(tids) and not set(tids) & set(procs)  # unique, never a pid
    for rank, events in run.events.items():
        names = [n for (pid, _), n in threads.items() if pid == rank]
        groups = {(e.kind, e.group) for e in events if e.kind in ("collective", "p2p")}
        for kind, group in groups:
            prefix = f"group {group} " if kind == "collective" else f"p2p in group {group} "
            main = [n for n in names if n.startswith(prefix) and "overlap" not in n]
            assert len(main) == 1, (kind, group, names)
        assert "group 0 (default_pg) [0-1]" in names
        assert names.count("spans") == 1
        # every slice sits on a named track of its own rank
        for s in _slices(trace):
            assert (s["pid"], s["tid"]) in threads


@pytest.mark.timeout(150)
def test_every_traced_op_is_one_slice_with_its_details(exported):
    run_dir, _, _, trace = exported
    run = read_run(run_dir)
    events = [e for evs in run.events.values() for e in evs]
    ops = [e for e in events if e.kind in ("collective", "p2p")]
    slices = _slices(trace, ("collective", "p2p"))
    assert len(slices) == len(ops) > 20
    assert (Counter((s["pid"], s["args"]["group"], s["args"]["seq"], s["args"]["op"])
                    for s in slices)
            == Counter((e.rank, e.group, e.seq, e.op) for e in ops))
    spans = [e for e in events if e.kind == "span"]
    assert len(_slices(trace, ("span",))) == len(spans)
    # 3 steps x 2 ranks, and each rank's creation of `pair` (the tracer's new_group span)
    assert sorted(e.name.split()[0] for e in spans) == ["new_group"] * 2 + ["step"] * 6
    by_line = defaultdict(list)
    for s in slices:
        a = s["args"]
        assert {"seq", "group", "shapes", "dtypes", "numel_in", "status", "async",
                "callsite"} <= set(a), a
        file, line = re.match(r"(.+):(\d+) ", a["callsite"]).groups()
        assert file.endswith("job.py")
        by_line[int(line)].append(s)
    assert {s["args"]["root"] for s in by_line[LINE["broadcast"]]} == {0}
    assert all(s["args"]["span"].startswith("step ") for s in by_line[LINE["broadcast"]])
    assert all(s["args"]["async"] is True for s in by_line[LINE["async"]])
    assert all(s["args"]["shapes"] == "[[4]]" and s["args"]["dtypes"] == "float32"
               and s["args"]["reduce_op"] == "sum" for s in by_line[LINE["all_reduce"]])
    assert len(by_line[LINE["all_reduce"]]) == 6  # 3 steps x 2 ranks


@pytest.mark.timeout(150)
def test_tracks_are_ordered_and_nest_as_perfetto_requires(exported):
    _, _, _, trace = exported
    threads = _threads(trace)
    per_track = defaultdict(list)
    for s in _slices(trace):
        per_track[(s["pid"], s["tid"])].append(s)
    for key, track in per_track.items():
        ts = [s["ts"] for s in track]
        assert ts == sorted(ts), threads[key]
        open_ends: list[float] = []
        for s in track:  # slices on a track never overlap; spans may nest
            while open_ends and open_ends[-1] <= s["ts"]:
                open_ends.pop()
            end = s["ts"] + s["dur"]
            if open_ends:
                assert threads[key] == "spans" and end <= open_ends[-1] + 1e-9, threads[key]
            open_ends.append(end)
    # the async and batched p2p ops that overlap went to a second lane
    assert any("overlap 2" in n for n in threads.values()), threads


@pytest.mark.timeout(150)
def test_in_flight_op_and_finding_on_the_culprit(exported):
    _, _, _, trace = exported
    hung = [s for s in _slices(trace) if s["args"]["status"] == "in_flight"]
    assert len(hung) == 1, hung
    s = hung[0]
    assert (s["pid"], s["name"], s["cname"]) == (0, "all_reduce (in flight)", "terrible")
    assert s["args"]["callsite"].split(" ")[0].endswith(f"job.py:{LINE['hung']}")
    assert s["dur"] > 1e6  # drawn up to rank 0's last heartbeat: past the 3 s hang timeout
    rank0 = [x for x in _slices(trace) if x["pid"] == 0]
    assert s["ts"] + s["dur"] >= max(x["ts"] + x["dur"] for x in rank0)
    instants = [e for e in trace["traceEvents"] if e["ph"] == "i"]
    hang = [e for e in instants if e["args"]["kind"] == "hang"]
    assert len(hang) == 1 and hang[0]["s"] == "p" and hang[0]["pid"] == 1, instants
    f = hang[0]
    assert f["cat"] == "finding" and f["args"]["ranks"] == "1" and f["args"]["seq"] == \
        s["args"]["seq"]
    assert f["name"].startswith("hang: rank 1 never joined")
    # rank 1 never entered the op: the finding sits where the others entered it
    assert f["ts"] == s["ts"] and f["args"]["placed_at"].startswith("where the other ranks")
    assert not [e for e in instants if e["pid"] == 0]


@pytest.mark.timeout(150)
def test_stdout_and_no_findings(exported):
    run_dir, _, _, trace = exported
    res = run_cli(["export", str(run_dir), "--perfetto", "-", "--no-findings"], timeout=60)
    assert res.returncode == 0, res.stderr
    again = json.loads(res.stdout)
    assert not [e for e in again["traceEvents"] if e["ph"] == "i"]
    assert len(_slices(again)) == len(_slices(trace))
    assert WROTE.match(res.stderr.strip().splitlines()[-1]).group(2) == "0"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", ["missing", "not_a_run", "file", "newer", "no_flag",
                                  "unwritable"])
def test_bad_input_is_one_line_exit_2(case, tmp_path):
    out = tmp_path / "out.json"
    run_dir = tmp_path / "run"
    args = ["export", str(run_dir), "--perfetto", str(out)]
    if case == "not_a_run":
        run_dir.mkdir()
    elif case == "file":
        run_dir.write_text("x")
    elif case == "newer":
        run_dir.mkdir()
        (run_dir / "run.json").write_text('{"format": "distdoctor-run", "version": 99}')
    elif case == "no_flag":
        args = args[:2]
    elif case == "unwritable":
        (run_dir / "ranks").mkdir(parents=True)
        (run_dir / "run.json").write_text('{"format": "distdoctor-run", "version": 1}')
        out = tmp_path / "no" / "such" / "dir" / "out.json"
        args[-1] = str(out)
    res = run_cli(args, timeout=50, cwd=tmp_path)
    assert res.returncode == 2, (case, res.stderr)
    assert "Traceback" not in res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("distdoctor: error:"), res.stderr
    assert not out.exists() and not list(tmp_path.rglob(".out.json.*"))


# --- constructed runs: clock alignment across hosts, lanes, finding placement -------------
def _ev(rank, index, op, enter, end, kind="collective", group="0", seq=0, **kw) -> Event:
    fields = dict(rank=rank, index=index, kind=kind, op=op,
                  status="ok" if end else "in_flight", group=group, group_desc="default_pg",
                  group_ranks=(0, 1, 2), seq=seq, peer=None, shapes=((4,),),
                  dtypes=("float32",), device="cpu", numel_in=4, numel_out=4,
                  reduce_op="sum", callsite={"file": "/x/train.py", "line": 10 + index,
                                             "function": "step"},
                  t_enter_ns=enter, t_end_ns=end, span_index=0, name=None, error=None,
                  is_async=False, other_thread=False)
    fields.update(kw)
    return Event(**fields)


def _header(rank, mono=0, wall=0) -> RingHeader:
    return RingHeader(rank, 100 + rank, 1024, 10, 0, mono, wall, True)


def test_hosts_are_aligned_by_wall_clock_and_overlaps_get_a_lane(tmp_path):
    # host a booted 1000 s after host b: the same wall instant reads 5e9 on a, 1.005e12 on b
    wall0 = 1_700_000_000_000_000_000
    a, b = 5_000_000_000, 1_005_000_000_000
    ms = 1_000_000
    events = {
        0: [_ev(0, 0, "all_reduce", a, a + 4 * ms, is_async=True),
            _ev(0, 1, "all_reduce", a + 1 * ms, a + 6 * ms, seq=1),  # overlaps the async one
            _ev(0, 2, "all_reduce", a + 10 * ms, a + 11 * ms, seq=2)],
        1: [_ev(1, 0, "all_reduce", b, b + 4 * ms), _ev(1, 1, "all_reduce", b + 2 * ms,
                                                          b + 6 * ms, seq=1),
            _ev(1, 2, "all_reduce", b + 10 * ms, None, seq=2)],  # in flight
        2: [_ev(2, 0, "all_reduce", a + 3 * ms, a + 4 * ms)],  # host a, no anchors of its own
    }
    headers = {0: _header(0, a + 20 * ms, wall0 + 20 * ms), 1: _header(1),
               2: _header(2)}
    ranks = {0: {"host": "a"}, 1: {"host": "b", "clock": {"wall_ns": wall0 - 5 * ms,
                                                           "monotonic_ns": b - 5 * ms}},
             2: {"host": "a"}}
    run = Run(RunInfo(tmp_path, {"world_size": 3}, ranks, [0, 1, 2]), events=events,
              headers=headers, meta=ranks)
    findings = [Finding("mismatch", "error", "mismatch: rank 1 differs", [1], "0", 1),
                Finding("hang", "error", "hang: stuck transport", [], None, None),
                Finding("crash", "error", "crash: rank 2 died", [2], "0", 7)]
    out = tmp_path / "t.json"
    stats = write_perfetto(run, findings, out)
    trace = json.loads(out.read_text())
    slices = _slices(trace)
    assert (stats.slices, stats.findings, stats.ranks, stats.in_flight) == (7, 3, 3, 1)
    enter = {(s["pid"], s["args"]["seq"]): s["ts"] for s in slices}
    assert enter[(0, 0)] == enter[(1, 0)] == 0.0  # same wall instant, different boot times
    assert enter[(1, 1)] == 2000.0 and enter[(2, 0)] == 3000.0  # rank 2: host a's anchor
    threads = _threads(trace)
    lanes = {threads[(s["pid"], s["tid"])] for s in slices if s["pid"] == 0}
    assert lanes == {"group 0 (default_pg) [0-2]", "group 0 (default_pg) [0-2] (overlap 2)"}
    (hung,) = [s for s in slices if s["args"]["status"] == "in_flight"]
    # rank 1 has no heartbeat: its clock is known up to its last event
    assert hung["pid"] == 1 and hung["dur"] == 0.0
    inst = {e["args"]["kind"]: e for e in trace["traceEvents"] if e["ph"] == "i"}
    assert inst["mismatch"]["ts"] == 2000.0 and inst["mismatch"]["pid"] == 1
    assert inst["hang"]["s"] == "g" and inst["hang"]["ts"] == 20000.0  # end of the trace
    assert inst["crash"]["pid"] == 2 and inst["crash"]["ts"] == 4000.0  # rank 2's end


def test_rank_ranges():
    assert rank_ranges((0, 1, 2, 3, 8)) == "0-3,8"
    assert rank_ranges((5,)) == "5"
    assert rank_ranges(tuple(range(0, 40, 2))).endswith("(20 ranks)")
