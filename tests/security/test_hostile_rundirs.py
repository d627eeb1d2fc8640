"""A run dir is written by ranks: other users' processes on shared nodes, crashed jobs,
copies from elsewhere. Whatever they leave at its names (a FIFO, a link to /dev/zero, JSON
nested 100,000 deep, fields of the wrong type, a log header that claims 2 GiB) costs that
file, said in one line; no command waits, takes unbounded memory or prints a traceback,
and the live engine goes on finding the hang and stopping the job.

The run dirs are real ones (a 2-rank job under `distdoctor run`) with one kind of thing
changed; every command runs as a user runs it, each under a memory limit (1 GiB of
address space: /dev/zero read whole is a MemoryError, not the machine's memory) and a hard
timeout (a wait on a FIFO is a timeout). Before these checks each of them hung, was a
traceback, or took gigabytes."""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import JOBS, run_cli, run_job

pytestmark = pytest.mark.timeout(120)

MEMORY_LIMIT = 1 << 30
RANK_AT = struct.calcsize("<8sIIIQQQQ")  # the rank field of a log header (runlog/format.py)
CAPACITY_AT, HEAD_AT = struct.calcsize("<8sIII"), 128


def _cli(args: list[str], timeout: float = 30) -> subprocess.CompletedProcess:
    """`python -m distdoctor ARGS` under MEMORY_LIMIT; a hang fails the test (killed)."""
    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))

    proc = subprocess.Popen([sys.executable, "-m", "distdoctor", *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, start_new_session=True,
                            preexec_fn=limit, env=dict(os.environ, COLUMNS="200"))
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"distdoctor {' '.join(map(str, args))} hung ({timeout} s)\n"
                    f"{err.decode(errors='replace')[-2000:]}")
    return subprocess.CompletedProcess(args, proc.returncode, out.decode(errors="replace"),
                                       err.decode(errors="replace"))


def _sane(proc: subprocess.CompletedProcess, codes=(0, 1)) -> str:
    """The command ended as it may (no traceback, no bug said) and told its lines."""
    said = proc.stdout + proc.stderr
    assert "Traceback" not in said and "a bug in distdoctor" not in said, said[-3000:]
    assert proc.returncode in codes, (proc.returncode, said[-3000:])
    return said


def _copy(run: Path, dest: Path) -> Path:
    subprocess.run(["cp", "-a", "--sparse=always", str(run), str(dest)], check=True)
    return dest


def _fifo(path: Path) -> None:
    path.unlink(missing_ok=True)
    os.mkfifo(path)


def _zero(path: Path) -> None:
    path.unlink(missing_ok=True)
    path.symlink_to("/dev/zero")


def _log_of_rank(run: Path, rank: int, dest: Path) -> Path:
    """Rank 0's log of `run`, copied to `dest` as rank `rank`'s (its header says so)."""
    shutil.copyfile(run / "ranks" / "rank-00000.ring", dest)
    with open(dest, "r+b") as f:
        f.seek(RANK_AT)
        f.write(struct.pack("<i", rank))
    return dest


def _corrupt_strings(ring: Path) -> None:
    """The log's group's ranks and its tensors' shapes become numbers (same lengths, so
    the string table stays whole): a corrupt copy a node forwarded."""
    with open(ring, "r+b") as f:
        table = f.read(4096 + (1 << 20))
        for pattern in (rb'"ranks":\[[\d,]+\]', rb'"shapes":\[\[\d+\]\]'):
            for m in re.finditer(pattern, table):
                key = m.group().split(b":")[0]
                f.seek(m.start())
                f.write((key + b":5").ljust(len(m.group())))


@pytest.fixture(scope="module")
def job(tmp_path_factory) -> Path:
    """A finished 2-rank run: 20 all_reduces each, every file a run writes."""
    run_dir = tmp_path_factory.mktemp("hostile") / "run"
    res = run_job("many_ops.py", 2, run_dir, "20")
    assert res.returncode == 0, res.stderr
    assert list((run_dir / "probes").glob("node-*.jsonl")), "no probe file to replace"
    return run_dir


def _every_reader(run: Path, tmp: Path) -> str:
    """diagnose, show, both exports, watch --once and pack on `run`: none hangs or fails;
    what diagnose said (its notes name each file it could not read)."""
    said = _sane(_cli(["diagnose", run]))
    for args in (["show", run], ["export", run, "--perfetto", tmp / "t.json"],
                 ["export", run, "--flight-recorder", tmp / "fr"], ["watch", "--once", run],
                 ["pack", run, "-o", tmp / "run.ddpack"]):
        _sane(_cli(args))
    return said


# --- post-mortem: diagnose, show, export, watch --once, pack ----------------------------
@pytest.mark.parametrize("put", [_fifo, _zero], ids=["fifo", "dev_zero"])
def test_fifos_and_devices_at_a_run_dirs_names_are_refused_in_one_line(job, tmp_path, put):
    run = _copy(job, tmp_path / "run")
    put(run / "ranks" / "rank-00000.json")
    put(run / "ranks" / "rank-00001.ring")
    put(run / "exits.json")
    put(run / "findings.json")
    probes = sorted((run / "probes").glob("node-*.jsonl"))
    put(probes[0])
    said = _every_reader(run, tmp_path)
    kind = "a FIFO" if put is _fifo else "a symbolic link"
    for name in ("rank-00000.json", "rank-00001.ring", "exits.json", "findings.json",
                 probes[0].name):
        line = next((x for x in said.splitlines() if name in x), None)
        assert line is not None and kind in line, (name, said)
    # rank 0's events are still read and diagnosed
    shown = _sane(_cli(["show", run, "--rank", "0"]))
    assert "all_reduce" in shown, shown
    # run.json itself: the one line that says the dir is not readable
    put(run / "run.json")
    for args in (["diagnose", run], ["show", run], ["watch", "--once", run]):
        err = _sane(_cli(args), codes=(2,))
        assert err.strip().count("\n") == 0, err


def test_hostile_json_in_a_run_dir_costs_that_file_only(job, tmp_path):
    run = _copy(job, tmp_path / "run")
    ranks = run / "ranks"
    (ranks / "rank-00000.json").write_text("[" * 100_000 + "]" * 100_000)
    meta = json.loads((ranks / "rank-00001.json").read_text())
    meta.update(host={"a": 1}, world_size=10**9, pid="1", clock=[1, 2])
    (ranks / "rank-00001.json").write_text(json.dumps(meta))
    written = {"findings": [{"kind": "hang", "severity": "error", "summary": 5,
                             "ranks": [1]}]}
    (run / "findings.json").write_text(json.dumps(written))
    (run / "exits.json").write_text('{"processes": ' + "[" * 100_000 + "]" * 100_000 + "}")
    said = _every_reader(run, tmp_path)
    assert "rank-00000.json: rank metadata unreadable (nested too deep)" in said, said
    assert "rank metadata's world_size, pid, host, clock not of their type" in said, said
    assert "findings.json is unreadable; live findings" in said, said
    assert "exits.json is unreadable: process exit codes unknown" in said, said
    # the ranks themselves: both read, none said missing out of a billion
    report = json.loads(_cli(["diagnose", run, "--json"]).stdout)
    assert not any("left no event log" in n for n in report["notes"]), report["notes"]
    for stranger in ("[1]", '"text"', "1e999"):  # JSON, not an object
        (ranks / "rank-00000.json").write_text(stranger)
        assert "rank metadata is not a JSON object" in _sane(_cli(["diagnose", run]))
    (run / "run.json").write_text("[" * 100_000 + "]" * 100_000)
    err = _sane(_cli(["diagnose", run]), codes=(2,))
    assert "run metadata" in err and "nested too deep" in err, err


def test_a_log_header_claiming_2_gib_is_read_a_piece_at_a_time(job, tmp_path):
    """A ring whose header claims 2.5 GiB of slots, all written (head = capacity), over a
    sparse file of that size: read whole it took 2.5 GB (over the limit here), and a
    read past 2 GiB came back short and was said as a log that 'shrank'. The holes are
    not read (SEEK_DATA); the rank's own events, in its first slots, are."""
    run = _copy(job, tmp_path / "run")
    ring = run / "ranks" / "rank-00001.ring"
    capacity = (5 << 29) // 128
    with open(ring, "r+b") as f:
        f.seek(CAPACITY_AT)
        f.write(struct.pack("<Q", capacity))
        f.seek(HEAD_AT)
        f.write(struct.pack("<Q", capacity))
        f.truncate(4096 + (4 << 20) + capacity * 128)
    said = _sane(_cli(["diagnose", run]))
    assert "shrank" not in said and "unknown" not in said, said
    before, after = (json.loads(_sane(_cli(["show", d, "--rank", "1", "--json"])))
                     for d in (job, run))
    assert after["ranks"]["1"] == before["ranks"]["1"], after  # its own events, all
    packed = _sane(_cli(["pack", run, "-o", tmp_path / "run.ddpack"]))
    assert "rank-00001.ring: its header counts events its ring does not hold" in packed


def test_a_corrupt_group_in_a_log_is_an_unknown_group_not_a_traceback(job, tmp_path):
    """A node's corrupt copy: its group's `ranks` and its tensors' shapes are numbers.
    diagnose, show and export read the rest; the collector's look at where each rank
    stands when a node goes quiet (collect/lost.py) keeps the other rank's position."""
    run = _copy(job, tmp_path / "run")
    _corrupt_strings(run / "ranks" / "rank-00001.ring")
    _every_reader(run, tmp_path)
    shown = _sane(_cli(["show", run, "--rank", "1"]))
    assert "all_reduce" in shown, shown
    code = ("import sys; from distdoctor.collect.lost import copy_positions; "
            "p = copy_positions(sys.argv[1], {0: (0, 'a'), 1: (0, 'b')}); "
            "print(sorted(p), p[1].op.group_ranks, p[1].op.shapes)")
    done = subprocess.run([sys.executable, "-c", code, str(run)], capture_output=True,
                          text=True, timeout=30)
    assert done.returncode == 0 and done.stdout.split() == ["[0,", "1]", "()", "()"], (
        done.stdout + done.stderr)


def test_a_call_site_naming_a_fifo_or_a_device_is_not_read(tmp_path):
    """The branch reading opens the file a call site names where the run kept no copy
    (an older run dir): a FIFO there held diagnose for ever, /dev/zero was read whole.
    Neither is a source: the mismatch is said without its branch."""
    job = tmp_path / "job"
    job.mkdir()
    for name in ("rank0_only_broadcast.py", "_common.py"):
        shutil.copy(JOBS / "bugs" / name, job / name)
    run = tmp_path / "run"
    res = run_cli(["run", "--nproc", "2", "--run-dir", str(run), "--grace", "2", "--on-hang",
                   "kill", "--", str(job / "rank0_only_broadcast.py")], timeout=60,
                  run_dir=run)
    assert "MISMATCH" in res.stderr, res.stderr
    shutil.rmtree(run / "sources")  # (what an older run dir holds)
    for put in (_fifo, _zero):
        put(job / "rank0_only_broadcast.py")
        said = _sane(_cli(["diagnose", run]), codes=(1,))
        assert "MISMATCH" in said, said
        _sane(_cli(["pack", run, "-o", tmp_path / "run.ddpack"]))


# --- live: `distdoctor run` follows a run dir with hostile files in it --------------------
def _live(run_dir: Path) -> tuple[subprocess.CompletedProcess, float]:
    """A job whose rank 1 sleeps while rank 0 waits in an all_reduce, under --on-hang kill,
    into `run_dir` (made beforehand, with what the test put in it). Its ranks are killed
    after, found through their own metadata (conftest's clean-up reads every rank's, and
    would wait on the test's FIFOs)."""
    args = [sys.executable, "-m", "distdoctor", "run", "--nproc", "2", "--run-dir",
            str(run_dir), "--grace", "2", "--on-hang", "kill", "--",
            str(JOBS / "waits" / "hangs.py"), "sleep"]
    start = time.monotonic()
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, start_new_session=True,
                            env=dict(os.environ, PYTHONUNBUFFERED="1"))
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)  # (it hung in a pass: SIGTERM hung too)
        try:
            out, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
        pytest.fail(f"distdoctor run was not done in 60 s:\n{err.decode()[-3000:]}")
    finally:
        for rank in (0, 1):
            meta = run_dir / "ranks" / f"rank-0000{rank}.json"
            try:
                os.kill(json.loads(meta.read_text())["pid"], signal.SIGKILL)
            except (OSError, ValueError, KeyError):
                pass
    return (subprocess.CompletedProcess(args, proc.returncode, out.decode(errors="replace"),
                                        err.decode(errors="replace")),
            time.monotonic() - start)


def _assert_hang_found_and_stopped(res, took: float, run_dir: Path) -> None:
    err = res.stderr
    assert "stopping the job (--on-hang kill)" in err and res.returncode != 0, err
    assert took < 60, took
    assert "Traceback" not in err and "pass of the live diagnosis failed" not in err, err
    findings = json.loads((run_dir / "findings.json").read_text())["findings"]
    hangs = [f for f in findings if f["kind"] == "hang" and f["severity"] == "error"]
    assert hangs and hangs[0]["ranks"] == [1], findings
    assert not [f for f in findings if f["kind"] == "internal"], findings


def test_fifos_in_ranks_never_hold_the_live_engine(job, tmp_path):
    """A FIFO at a rank's log name (open() waited for a writer, holding the engine's lock:
    no hang found, --on-hang kill never fired, SIGTERM to `run` hung), and one at a log's
    metadata name."""
    run_dir = tmp_path / "run"
    (run_dir / "ranks").mkdir(parents=True)
    os.mkfifo(run_dir / "ranks" / "rank-00006.ring")
    _log_of_rank(job, 7, run_dir / "ranks" / "rank-00007.ring")
    os.mkfifo(run_dir / "ranks" / "rank-00007.json")
    res, took = _live(run_dir)
    _assert_hang_found_and_stopped(res, took, run_dir)
    lines = res.stderr.splitlines()
    assert [x for x in lines if "rank-00006.ring: a FIFO, not a regular file" in x], lines
    said = [x for x in lines if "rank-00007.json: rank metadata unreadable (a FIFO" in x]
    assert len(said) == 1, lines  # said once, not on every pass


def test_hostile_rank_files_cost_their_rank_only_in_the_live_engine(job, tmp_path):
    """Metadata nested 100,000 deep (RecursionError), a list (AttributeError), /dev/zero
    (read for ever), and a log whose group's ranks are a number (TypeError): each failed
    every pass (no hang found, no kill); now each is one line and the job's ranks are
    diagnosed."""
    run_dir = tmp_path / "run"
    ranks = run_dir / "ranks"
    ranks.mkdir(parents=True)
    for rank in (4, 5, 6, 7):
        _log_of_rank(job, rank, ranks / f"rank-0000{rank}.ring")
    (ranks / "rank-00004.json").write_text("[" * 100_000 + "]" * 100_000)
    (ranks / "rank-00005.json").write_text("[1]")
    (ranks / "rank-00006.json").symlink_to("/dev/zero")
    _corrupt_strings(ranks / "rank-00007.ring")
    res, took = _live(run_dir)
    _assert_hang_found_and_stopped(res, took, run_dir)
    err = res.stderr
    assert "rank-00004.json: rank metadata unreadable (nested too deep)" in err, err
    assert "rank-00005.json: rank metadata is not a JSON object" in err, err
    assert "rank-00006.json: rank metadata unreadable (a symbolic link" in err, err


def test_a_fifo_at_a_rank_metadata_name_never_holds_a_nodes_forwarder(job, tmp_path):
    """A node forwards its run dir to the collector (collect/forward.py): it read each
    rank's metadata with read_bytes, so a FIFO there held its thread for ever and the
    collector heard nothing more of that node. A real forwarder and collector, on
    loopback."""
    import threading

    from distdoctor.collect.forward import Forwarder
    from distdoctor.collect.server import Collector, listen
    from distdoctor.runlog.follow import RunFollower

    run = _copy(job, tmp_path / "node")
    _fifo(run / "ranks" / "rank-00001.json")
    collector = Collector(tmp_path / "copy", listen(("127.0.0.1", 0)), None,
                          lambda line: None).start()
    try:
        fwd = Forwarder(run, collector.address)
        ticked = threading.Thread(target=fwd.tick, daemon=True)
        ticked.start()
        ticked.join(20)
        if ticked.is_alive():  # let the waiting open() go, so the thread ends
            with open(run / "ranks" / "rank-00001.json", "wb"):
                pass
            ticked.join(10)
            pytest.fail("the forwarder's pass waited on the FIFO")
        fwd.stop()
        deadline = time.monotonic() + 20
        follower = RunFollower(tmp_path / "copy")
        copied = []
        while len(copied) < 2 * 20 and time.monotonic() < deadline:
            copied += [e for e in follower.poll() if e.kind == "collective"]
            time.sleep(0.1)
        assert sorted({e.rank for e in copied}) == [0, 1], copied  # both ranks' events
        assert (tmp_path / "copy" / "ranks" / "rank-00000.json").is_file()
    finally:
        collector.stop()


def test_probe_lines_of_any_shape_cost_their_readings_only(job, tmp_path):
    """A probe file's lines with readings of the wrong type (a time that is a list, host
    readings that are a list, a process whose rank is text, a GPU whose reasons are a
    number, a trillion for a clock): every reader reads the run dir, and the readings that
    are sound stay. Before: `watch --once` stopped for the whole run dir ("'<' not
    supported between instances of 'float' and 'list'", a bug in distdoctor)."""
    run = _copy(job, tmp_path / "run")
    probe = sorted((run / "probes").glob("node-*.jsonl"))[0]
    lines = probe.read_text().splitlines()
    sample = json.loads(lines[-1])
    odd = [dict(sample, t=[10**12]), dict(sample, host_stats=[1, 2]),
           dict(sample, t=sample["t"] + 1, processes=[{"rank": "0", "pid": [1]}, None]),
           dict(sample, t=sample["t"] + 2, gpus=[{"t": 1.0, "source": "live", "index": 0,
                                                   "reasons": 7, "sm_clock_mhz": 10**30,
                                                   "violation_ns": [1]}],
                gpu_of_rank={"9" * 40: "x", "0": 5})]
    probe.write_text("\n".join(lines + [json.dumps(o) for o in odd]) + "\n")
    _every_reader(run, tmp_path)
    _sane(_cli(["watch", "--once", run]))
