"""Chaos of distdoctor's own processes: SIGKILL of `watch --once` while it reads a live
job, of the collector, of a forwarding node's `run`. The job's outcome must be what it
would be without distdoctor, and distdoctor says what it lost in one line, with no
traceback of its own. The processes and their clean-up: chaosprocs.py."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import signal
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from chaosprocs import (
    CHAOS,
    NEEDS_PROC,
    Proc,
    Procs,
    _diagnose,
    _diagnose_any,
    _done_lines,
    _errors,
    _no_traceback,
    _op_counts,
    _until,
    chaos_procs,
    procs_fixture,  # noqa: F401  (the procs fixture)
)

from distdoctor.launch.env import free_port
from distdoctor.runlog.reader import RankLog
from distdoctor.runlog.run import read_incarnations
from distdoctor.runlog.rundir import rank_meta_path, ring_path

pytestmark = NEEDS_PROC


def _events(run_dir: Path, rank: int) -> int:
    """Ops and spans in a rank's first log, the sampler's records left out (0 while it
    has none)."""
    try:
        log = RankLog(ring_path(run_dir, rank))
    except Exception:
        return 0
    try:
        return sum(1 for e in log.read() if e is not None and e.kind != "sample")
    except Exception:
        return 0
    finally:
        log.close()


def _steady_ops(out: str) -> int:
    """How many all_reduces tests/jobs/chaos/steady.py did, checked: both ranks the same,
    each with the sum it must have reduced (sum_i (i + 0) + (i + 1): the count squared)."""
    done = _done_lines(out)
    counts = {int(m.group(1)) for m in (re.match(r"rank \d+ done: (\d+) all_reduces", line)
                                        for line in done) if m}
    assert len(done) == 2 and len(counts) == 1, out
    ops = counts.pop()
    assert done == [f"rank {r} done: {ops} all_reduces, sum {float(ops * ops):g}"
                    for r in (0, 1)], out
    return ops


def _collector(procs: Procs, copy: Path) -> tuple[Proc, int]:
    """`watch --listen` as a service (no terminal), on a free port."""
    for _ in range(3):  # a free port may be taken before the collector binds it
        port = free_port()
        collector = procs.distdoctor("watch", copy, "--listen", f"127.0.0.1:{port}")
        with contextlib.suppress(AssertionError):
            collector.wait_for("collecting on", 30)
            return collector, port
        collector.finish(10)
    raise AssertionError(f"the collector did not start:\n{collector.err}")


# --- 1. watch --once SIGKILLed while it reads a live job -----------------------------------

def _reads_a_log(pid: int, ranks_dir: str) -> bool:
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(ranks_dir):
                    return True
    except OSError:
        pass
    return False


MANY = 1_000_000  # steady.py's bound on all_reduces: the tests stop it long before


@pytest.mark.timeout(150)
def test_watch_once_sigkilled_mid_read_costs_the_job_nothing(tmp_path, procs):
    """`watch --once` started over and over while the job runs, most of them SIGKILLed the
    moment they hold a rank's log open (or shortly after they start), some left to print
    their snapshot: the job ends as it would have, and its run dir reads whole."""
    run_dir, stop = (tmp_path / "run").resolve(), tmp_path / "stop"
    job = procs.distdoctor("run", "--nproc", "2", "--run-dir", run_dir, "--grace", "2", "--",
                           CHAOS / "steady.py",
                           env={"CHAOS_OPS": MANY, "CHAOS_SLEEP_MS": 1, "CHAOS_STOP": stop})
    _until(lambda: _events(run_dir, 0) > 200 and _events(run_dir, 1) > 200, 60,
           "the ranks' logs", job)
    ranks_dir = str(run_dir / "ranks")
    mid_read, early, snapshots = 0, 0, []
    plan = itertools.cycle(["reading", 0.05, "reading", "reading", 0.2, "whole"])
    deadline = time.monotonic() + 60
    while (mid_read < 6 or early < 2 or len(snapshots) < 2) and time.monotonic() < deadline:
        assert job.poll() is None, job.err[-3000:]
        how = next(plan)
        watch = procs.distdoctor("watch", run_dir, "--once")
        if how == "whole":
            snapshots.append((watch.finish(60), watch.out, watch.err))
            continue
        if how == "reading":
            until = time.monotonic() + 10
            while (watch.poll() is None and time.monotonic() < until
                   and not _reads_a_log(watch.pid, ranks_dir)):
                time.sleep(0.0005)
            if watch.poll() is None and _reads_a_log(watch.pid, ranks_dir):
                watch.kill()
                mid_read += 1
        else:
            time.sleep(how)
            if watch.poll() is None:
                watch.kill()
                early += 1
        watch.finish(30)
    stop.touch()
    code = job.finish(60)
    assert code == 0, job.err[-3000:]
    ops = _steady_ops(job.out)
    assert ops < MANY  # it ran until told to stop
    _no_traceback(job.err)
    assert mid_read >= 6, f"only {mid_read} watch(es) killed while reading a log"
    assert snapshots, "no watch printed a snapshot"
    for snap_code, out, err in snapshots:
        assert snap_code in (0, 1), out + err
        assert "ranks" in out, out
        _no_traceback(err)
    code, diag, _ = _diagnose(procs, run_dir)
    assert code == 0 and not _errors(diag) and diag["notes"] == [], diag
    assert _op_counts(run_dir) == [ops + 2, ops + 2]  # the one that stopped, the barrier


# --- 2. the collector SIGKILLed while a node forwards to it --------------------------------

@pytest.fixture(scope="module")
def collector_killed(tmp_path_factory):
    base = tmp_path_factory.mktemp("collector_killed").resolve()
    with chaos_procs(base) as procs:
        copy, run_dir, stop = base / "copy", base / "run", base / "stop"
        collector, port = _collector(procs, copy)
        node = procs.distdoctor(
            "run", "--forward", f"127.0.0.1:{port}", "--nproc", "2", "--run-dir", run_dir,
            "--grace", "2", "--", CHAOS / "steady.py",
            env={"CHAOS_OPS": MANY, "CHAOS_SLEEP_MS": 10, "CHAOS_STOP": stop})
        collector.wait_for("connected", 60)
        _until(lambda: _events(copy, 0) > 20 and _events(copy, 1) > 20, 60,
               "events in the collector's copy", node)
        collector.kill()
        collector.finish(30)
        node.wait_for("lost the collector at", 30)
        time.sleep(2)  # the job goes on a while without its collector (the forwarder retries)
        stop.touch()
        code = node.finish(60)
        return SimpleNamespace(code=code, out=node.out, err=node.err, run_dir=run_dir,
                               diagnosis=_diagnose(procs, run_dir),
                               collector_err=collector.err)


@pytest.mark.timeout(200)
def test_a_collector_sigkilled_mid_job_costs_the_job_nothing(collector_killed):
    got = collector_killed
    assert got.code == 0, got.err[-3000:]
    ops = _steady_ops(got.out)
    _no_traceback(got.err)
    _no_traceback(got.collector_err)
    assert got.err.count("lost the collector at 127.0.0.1:") == 1, got.err
    code, diag, _ = got.diagnosis
    assert code == 0 and not _errors(diag), diag
    assert _op_counts(got.run_dir) == [ops + 2, ops + 2]


@pytest.mark.timeout(200)
def test_a_collector_sigkilled_mid_job_is_one_line_of_the_nodes_run(collector_killed):
    err = collector_killed.err
    after = err.split("forwarding to the collector", 1)[1].splitlines()[1:]
    about = [line for line in after if "the collector at" in line]
    assert len(about) == 1, err


# --- 3. a forwarding node's run SIGKILLed mid-job ------------------------------------------

NODE_END = re.compile(r"distdoctor: (?:node \S+ \(127\.0\.0\.1:\d+\) finished|"
                      r"(?:lost|dropped) node \S+ \(127\.0\.0\.1:\d+\))")


@pytest.fixture(scope="module")
def node_killed(tmp_path_factory):
    base = tmp_path_factory.mktemp("node_killed").resolve()
    with chaos_procs(base) as procs:
        copy, run_dir = base / "copy", base / "run"
        collector, port = _collector(procs, copy)
        node = procs.distdoctor(
            "run", "--forward", f"127.0.0.1:{port}", "--nproc", "2", "--run-dir", run_dir,
            "--grace", "2", "--", CHAOS / "steady.py",
            env={"CHAOS_OPS": MANY, "CHAOS_SLEEP_MS": 10})  # until killed
        collector.wait_for("connected", 60)
        _until(lambda: _events(copy, 0) > 20 and _events(copy, 1) > 20, 60,
               "events in the collector's copy", node)
        node.kill()  # run alone: its guardian stops the job
        node.finish(30)
        ranks = [json.loads(rank_meta_path(run_dir, r).read_text())["pid"] for r in (0, 1)]
        _until(lambda: not any(os.path.exists(f"/proc/{pid}") and not _zombie(pid)
                               for pid in ranks), 30, "the node's ranks stopped")
        _until(lambda: NODE_END.search(collector.err), 30, "the collector's line on the node")
        time.sleep(1)  # anything more it would say about that node
        alive = collector.poll() is None
        collector.kill(signal.SIGTERM)
        code = collector.finish(30)
        return SimpleNamespace(alive=alive, code=code, err=collector.err, copy=copy,
                               diagnosis=_diagnose_any(procs, copy))


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except (OSError, IndexError):
        return True


@pytest.mark.timeout(200)
def test_a_node_sigkilled_mid_job_leaves_the_collector_and_its_copy_whole(node_killed):
    got = node_killed
    assert got.alive, got.err
    assert got.code == 0, got.err
    _no_traceback(got.err)
    assert len(NODE_END.findall(got.err)) == 1, got.err  # one line on the node's end
    assert "distdoctor: collected " in got.err, got.err
    code, diag, err = got.diagnosis
    assert code in (0, 1), err
    _no_traceback(err)
    assert set(diag) >= {"findings", "notes"}, diag
    run = read_incarnations(got.copy)[-1]
    assert sorted(run.events) == [0, 1] and all(len(run.events[r]) > 20 for r in (0, 1))


@pytest.mark.timeout(200)
def test_a_node_sigkilled_mid_job_is_said_lost_by_the_collector(node_killed):
    line = NODE_END.search(node_killed.err).group(0)
    assert "lost" in line, node_killed.err
