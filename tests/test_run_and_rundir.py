"""`distdoctor run`, the run directory and its event logs, on real gloo jobs."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import JOBS, marker_lines, run_cli, run_job

from distdoctor.runlog.reader import RankLog
from distdoctor.runlog.run import read_run
from distdoctor.runlog.rundir import ring_path

pytestmark = pytest.mark.timeout(180)


def test_events_of_a_sigkilled_rank_survive(tmp_path):
    run_dir = tmp_path / "run"
    flags = tmp_path / "flags"
    flags.mkdir()
    res = run_job("killed_in_collective.py", 2, run_dir, str(flags))
    assert res.returncode == 128 + 9, res.stderr  # the job's exit code: killed by SIGKILL
    assert "rank 1 exited SIGKILL" in res.stderr
    run = read_run(run_dir)
    line = marker_lines("killed_in_collective.py")["in_flight"]
    last = run.events[1][-1]
    assert (last.op, last.status, last.shapes) == ("all_reduce", "in_flight", ((123,),))
    assert last.callsite["line"] == line and last.t_end_ns is None
    assert not run.headers[1].closed  # no clean interpreter exit was recorded
    assert run.events[0][-1].status == "ok"


def test_ring_is_bounded_and_counts_dropped_events(tmp_path):
    run_dir = tmp_path / "run"
    # the main-thread sampler off: every slot is one of the job's ops, counted exactly
    res = run_job("many_ops.py", 2, run_dir, "3000", env={"DISTDOCTOR_RING_MIB": "0.05",
                                                          "DISTDOCTOR_SAMPLE_HZ": "0"})
    assert res.returncode == 0, res.stderr
    capacity = int(0.05 * 2**20) // 128
    for rank in (0, 1):
        log = RankLog(ring_path(run_dir, rank))
        header = log.header()
        assert header.capacity == capacity and header.head == 3000
        assert header.dropped == 3000 - capacity
        events = log.read()
        assert len(events) == capacity
        assert [e.seq for e in events] == list(range(3000 - capacity, 3000))
        assert all(e.shapes == ((1 + e.seq % 7,),) for e in events)
        assert os.path.getsize(ring_path(run_dir, rank)) < 5 * 2**20  # strings + ring


def test_tracing_wraps_torchrun_and_leaves_results_bit_identical(tmp_path):
    traced_out, plain_out = tmp_path / "traced.pt", tmp_path / "plain.pt"
    run_dir = tmp_path / "run"
    from distdoctor.launch.env import free_port

    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                "--master-port", str(free_port())]
    res = run_cli(["run", "--run-dir", str(run_dir), "--", *torchrun,
                   str(JOBS / "determinism.py"), str(traced_out)], run_dir=run_dir)
    assert res.returncode == 0, res.stderr
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISTDOCTOR")}
    torchrun[-1] = str(free_port())
    plain = subprocess.run([*torchrun, str(JOBS / "determinism.py"), str(plain_out)],
                           env=env, capture_output=True, text=True, timeout=120,
                           stdin=subprocess.DEVNULL)
    assert plain.returncode == 0, plain.stderr
    for a, b in zip(torch.load(traced_out), torch.load(plain_out), strict=True):
        assert torch.equal(a, b)
    run = read_run(run_dir)
    assert sorted(run.events) == [0, 1]
    ddp = [e for e in run.events[0] if e.op == "all_reduce" and e.shapes == ((2372,),)]
    assert len(ddp) == 10  # one gradient bucket per step
    assert run.info.ranks[1]["local_rank"] == 1 and run.info.ranks[1]["world_size"] == 2


@pytest.mark.parametrize("status", [0, 3])
def test_a_rank_leaving_through_os_exit_has_exited_with_its_status(tmp_path, status):
    """Under torchrun no exit status reaches distdoctor: a rank that skips its exit hooks
    (os._exit) would look dead. Its log takes the status: 0 is no finding, 3 a crash."""
    from distdoctor.launch.env import free_port

    run_dir = tmp_path / "run"
    res = run_cli(["run", "--run-dir", str(run_dir), "--", sys.executable, "-m",
                   "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
                   str(free_port()), str(JOBS / "os_exit.py"), str(status)], run_dir=run_dir)
    assert res.returncode == (1 if status else 0), res.stderr
    run = read_run(run_dir)
    assert [run.headers[r].exit_code for r in (0, 1)] == [0, status]
    post = run_cli(["diagnose", str(run_dir), "--json"])
    crashes = [f for f in json.loads(post.stdout)["findings"] if f["kind"] == "crash"]
    if not status:
        assert crashes == [] and "CRASH" not in res.stderr, res.stderr
        return
    assert [f["ranks"] for f in crashes] == [[1]], post.stdout
    line = marker_lines("os_exit.py")["exit"]
    assert f"exited with code 3 through os._exit at {JOBS / 'os_exit.py'}:{line}" in \
        crashes[0]["summary"], crashes
    assert crashes[0]["callsites"][0]["line"] == line, crashes


@pytest.mark.parametrize("status,launch", [(0, "nproc"), (1, "nproc"), (1, "spawn")])
def test_a_rank_that_calls_sys_exit_mid_training_is_named_at_that_line(tmp_path, status,
                                                                        launch):
    """Rank 1's data helper calls sys.exit at step 5 while rank 0 goes on to the next
    all-reduce. The finding about rank 1 (a crash for status 1, the hang it leaves for
    status 0, an exit that is no error to it) says its status and the sys.exit line, and
    names that line first. A SystemExit the job caught before training is not taken for
    the exit; under torch.multiprocessing.spawn, neither is the child's own sys.exit
    that passes the status on."""
    from distdoctor.launch.env import free_port

    run_dir = tmp_path / "run"
    job = JOBS / "sys_exit_early.py"
    how = ["--nproc", "2"] if launch == "nproc" else []
    tail = [str(job), str(status)] if launch == "nproc" else [
        sys.executable, str(job), str(status), "--spawn"]
    run_cli(["run", *how, "--run-dir", str(run_dir), "--grace", "2", "--on-hang", "kill",
             "--", *tail], timeout=120, run_dir=run_dir, env={"SPAWN_PORT": str(free_port())})
    assert read_run(run_dir).headers[1].exit_code == status
    findings = json.loads((run_dir / "findings.json").read_text())["findings"]
    errors = [f for f in findings if f["severity"] == "error"]
    assert [(f["kind"], f["ranks"]) for f in errors] == [
        ("crash" if status else "hang", [1])], findings
    line = marker_lines("sys_exit_early.py")["exit"]
    assert (f"exited with code {status} through sys.exit at {job}:{line} in next_batch"
            in errors[0]["summary"]), errors[0]["summary"]
    assert (errors[0]["callsites"][0]["rank"], errors[0]["callsites"][0]["line"]) == \
        (1, line), errors[0]["callsites"]
    if status:  # the step it left in, as the job counts it (5 optimizer steps taken)
        assert errors[0]["details"]["span"] == "step 5", errors[0]["summary"]
        assert "in next_batch, in step 5;" in errors[0]["summary"], errors[0]["summary"]


def test_the_start_up_hook_imports_no_torch():
    """`run` arms every Python process through sitecustomize, which must not import torch:
    c10d imported before the import hook is set is never patched (no rank is traced)."""
    code = ("import sys; from distdoctor.tracer import install; "
            "install.install_import_hook(); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.strip() == "False", out.stdout + out.stderr


def test_show_prints_ranks_side_by_side_and_json(tmp_path):
    run_dir = tmp_path / "run"
    assert run_job("many_ops.py", 2, run_dir, "5").returncode == 0
    res = run_cli(["show", str(run_dir), "--last", "3"], env={"COLUMNS": "120"})
    assert res.returncode == 0, res.stderr
    assert "rank 0" in res.stdout and "rank 1" in res.stdout
    assert res.stdout.count("all_reduce") == 6 and "many_ops.py:10" in res.stdout
    one = run_cli(["show", str(run_dir), "--rank", "1", "--json"])
    events = json.loads(one.stdout)["ranks"]["1"]
    assert [e["seq"] for e in events] == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("case", ["missing", "file", "foreign", "newer", "corrupt_json",
                                  "truncated_ring", "foreign_ring", "bad_rank"])
def test_bad_run_dirs_give_one_line_and_nonzero_exit(tmp_path, case, good_run):
    run_dir = tmp_path / "run"
    shutil.copytree(good_run, run_dir)
    ring = ring_path(run_dir, 0)
    args = ["show", str(run_dir)]
    if case == "missing":
        args = ["show", str(tmp_path / "nope")]
    elif case == "file":
        (tmp_path / "f").write_text("x")
        args = ["show", str(tmp_path / "f")]
    elif case == "foreign":
        (run_dir / "run.json").write_text('{"format": "something-else"}')
    elif case == "newer":
        (run_dir / "run.json").write_text('{"format": "distdoctor-run", "version": 99}')
    elif case == "corrupt_json":
        (run_dir / "run.json").write_text('{"format": "distdoc')
    elif case == "truncated_ring":
        os.truncate(ring, 10_000)
        args = ["show", str(run_dir), "--rank", "0"]
    elif case == "foreign_ring":
        ring.write_bytes(b"\x00" * 8192)
        args = ["show", str(run_dir), "--rank", "0"]
    elif case == "bad_rank":
        args = ["show", str(run_dir), "--rank", "7"]
    res = run_cli(args)
    assert res.returncode != 0
    assert "Traceback" not in res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("distdoctor: error:"), res.stderr


def test_bad_flags_give_one_line(tmp_path):
    for args in (["run"], ["run", "--nproc", "0", "--", "x.py"], ["show", "--last", "0"],
                 ["frobnicate"], ["run", "--nproc", "two", "--", "x.py"]):
        res = run_cli(args, cwd=tmp_path)
        assert res.returncode == 2, (args, res.stderr)
        assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1


@pytest.fixture(scope="module")
def good_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("good") / "run"
    assert run_job("many_ops.py", 2, run_dir, "5").returncode == 0
    return run_dir


def test_install_without_torch_distributed_is_harmless(tmp_path):
    code = ("import distdoctor\n"
            "distdoctor.install()\n"
            "@distdoctor.trace\n"
            "def f(x):\n    return x + 1\n"
            "with distdoctor.trace('block'):\n    assert f(1) == 2\n"
            "import torch\nprint(torch.ones(2).sum().item())\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, cwd=tmp_path, stdin=subprocess.DEVNULL)
    assert res.returncode == 0 and res.stdout.strip() == "2.0"
    assert "distdoctor" not in res.stderr, res.stderr
    assert not Path(tmp_path, "distdoctor-runs").exists()


def test_a_ring_with_foreign_strings_reads_as_unknown_not_a_traceback(tmp_path):
    """Decoded groups and tensor descriptions are cached per string id; a string that
    is valid JSON but not the expected object (another writer, a bit flip) reads as
    unknown fields, and the next event with a good string reads in full."""
    from distdoctor.runlog import format as F
    from distdoctor.runlog.ring import RingWriter

    path = tmp_path / "rank-00000.ring"
    w = RingWriter(str(path), 0, 64 * F.SLOT_SIZE, 4096)
    bad = w.add_string([1, 2, 3])
    group = w.add_string({"name": "7", "desc": "tp", "ranks": [2, 3], "size": 2})
    tensors = w.add_string({"shapes": [[4, 2]], "dtypes": ["bfloat16"], "device": "cpu"})
    for g, t in ((bad, bad), (group, tensors), (bad, 0)):
        w.complete(w.append(F.KIND_COLLECTIVE, 0, 0, 0, g, 0, 0, -1, t, 8, 8, 1, 0, 0),
                   F.STATUS_OK, 2)
    first, good, last = RankLog(path).read()
    assert (first.group, first.group_ranks, first.shapes, first.device) == ("?", (), (), "")
    assert (good.group, good.group_desc, good.group_ranks) == ("7", "tp", (2, 3))
    assert (good.shapes, good.dtypes, good.numel_in) == (((4, 2),), ("bfloat16",), 8)
    assert (last.group, last.shapes) == ("?", ())


@pytest.mark.timeout(150)
def test_a_ranks_exception_is_said_once_and_listed_first(tmp_path):
    """Told by the job's output and by the tracer: one live line, one finding, the cause
    before its consequences (rank 0's closed connection) live and post-mortem."""
    run_dir = tmp_path / "run"
    job = JOBS / "crashes" / "one_rank_raises.py"
    out = run_cli(["run", "--nproc", "2", "--run-dir", str(run_dir), "--", str(job)],
                  run_dir=run_dir)
    assert out.returncode != 0
    said = [ln for ln in out.stderr.splitlines() if ln.startswith("distdoctor: CRASH")]
    assert sum("CheckpointWriteError" in ln for ln in said) == 1, out.stderr
    written = json.loads((run_dir / "findings.json").read_text())["findings"]
    assert [f["severity"] for f in written][0] == "error" and written[0]["ranks"] == [1]
    assert sum("CheckpointWriteError" in f["summary"] for f in written) == 1, written
    assert "one_rank_raises.py:20" in written[0]["summary"]
    report = json.loads(run_cli(["diagnose", "--json", str(run_dir)]).stdout)["findings"]
    assert report[0]["ranks"] == [1] and report[0]["severity"] == "error", report
    assert all(f["severity"] != "error" for f in report[1:]), report
