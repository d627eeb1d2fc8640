"""Chaos of distdoctor's own processes, and of a rank's: SIGKILL of `watch --once` while it
reads a live job, of the collector, of a forwarding node's `run`; a rank that closes every
file descriptor gloo does not need and opens files of its own; a rank that forks.

Real processes: gloo on CPU, 2 ranks. The job's outcome must be what it would be without
distdoctor, and distdoctor says what it lost in one line, with no traceback of its own.

Every process a test starts carries CHAOS_TAG=<a value of its own> in its environment (the
ranks, run's guardian, a forked child inherit it); whatever happens, each scenario ends by
SIGKILLing every live process that carries it or names its folder on its command line.
Every wait has its own deadline, well within pytest's timeout (whose thread method ends
pytest without running finalizers)."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import JOBS, live_processes
from distdoctor.probes import stacks

from distdoctor.launch.env import free_port
from distdoctor.runlog.reader import RankLog
from distdoctor.runlog.run import read_incarnations
from distdoctor.runlog.rundir import rank_meta_path, ring_path

CHAOS = JOBS / "chaos"
TAG = "CHAOS_TAG"
pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs /proc")


# --- processes ---------------------------------------------------------------------------

class Proc:
    """A process in a session of its own, no terminal, its stdout and stderr read line by
    line in threads (never blocks the test)."""

    def __init__(self, argv: list[str], env: dict):
        self.argv = argv
        self.popen = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, env=env, start_new_session=True)
        self.pid = self.popen.pid
        self._lines: dict[str, list[str]] = {"out": [], "err": []}
        self._readers = [threading.Thread(target=self._read, args=(stream, self._lines[name]),
                                          daemon=True)
                         for name, stream in (("out", self.popen.stdout),
                                              ("err", self.popen.stderr))]
        for reader in self._readers:
            reader.start()

    @staticmethod
    def _read(stream, lines: list[str]) -> None:
        for raw in iter(stream.readline, b""):
            lines.append(raw.decode(errors="replace"))

    @property
    def out(self) -> str:
        return "".join(self._lines["out"])

    @property
    def err(self) -> str:
        return "".join(self._lines["err"])

    def poll(self) -> int | None:
        return self.popen.poll()

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.popen.poll() is None:
            with contextlib.suppress(OSError):
                os.kill(self.pid, sig)

    def finish(self, timeout_s: float) -> int:
        """Its exit code, once it ended and its output is read (fails after timeout_s)."""
        try:
            code = self.popen.wait(timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{' '.join(map(str, self.argv))} still running after "
                                 f"{timeout_s} s\n{self.out[-2000:]}\n{self.err[-3000:]}"
                                 ) from None
        for reader in self._readers:  # a process it left behind may hold the pipes
            reader.join(10)
        return code

    def wait_for(self, text: str, timeout_s: float, stream: str = "err") -> str:
        deadline = time.monotonic() + timeout_s
        while True:
            for line in list(self._lines[stream]):
                if text in line:
                    return line
            if time.monotonic() > deadline or (
                    self.popen.poll() is not None
                    and not any(r.is_alive() for r in self._readers)):
                raise AssertionError(f"no line with {text!r} within {timeout_s} s from "
                                     f"{' '.join(map(str, self.argv))}:\n{self.out[-2000:]}"
                                     f"\n{self.err[-3000:]}")
            time.sleep(0.05)


class Procs:
    """What a scenario starts, all of it SIGKILLed by `cleanup`."""

    def __init__(self, base: Path):
        self.base = base
        self.tag = uuid.uuid4().hex
        self.started: list[Proc] = []

    def _env(self, extra: dict | None) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith("DISTDOCTOR_")}
        env.update(PYTHONUNBUFFERED="1", **{TAG: self.tag})
        env.update({k: str(v) for k, v in (extra or {}).items()})
        return env

    def distdoctor(self, *args, env: dict | None = None) -> Proc:
        return self.python("-m", "distdoctor", *args, env=env)

    def python(self, *args, env: dict | None = None) -> Proc:
        proc = Proc([sys.executable, *map(str, args)], self._env(env))
        self.started.append(proc)
        return proc

    def tagged(self) -> list[int]:
        """Live processes (not zombies) with our tag in their environment or our folder on
        their command line."""
        tag, folder = f"{TAG}={self.tag}".encode(), str(self.base).encode()
        return [pid for pid, env, argv in live_processes()
                if tag in env.split(b"\0") or folder in argv]

    def cleanup(self) -> None:
        for proc in self.started:
            if proc.poll() is None:
                with contextlib.suppress(OSError):
                    os.killpg(proc.pid, signal.SIGKILL)
        for _ in range(3):  # a process may fork while we look
            for pid in self.tagged():
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        for proc in self.started:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(10)


@contextlib.contextmanager
def chaos_procs(base: Path):
    procs = Procs(base)
    try:
        yield procs
    finally:
        procs.cleanup()


@pytest.fixture
def procs(tmp_path):
    with chaos_procs(tmp_path) as p:
        yield p


# --- helpers -----------------------------------------------------------------------------

def _until(predicate, timeout_s: float, what: str, proc: Proc | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s} s"
                                 + (f"\n{proc.out[-2000:]}\n{proc.err[-3000:]}" if proc else ""))
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"{what}: {' '.join(proc.argv)} ended ({proc.poll()}) first"
                                 f"\n{proc.out[-2000:]}\n{proc.err[-3000:]}")
        time.sleep(0.02)


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


def _no_traceback(text: str) -> None:
    assert "Traceback" not in text and "Exception ignored" not in text, text[-4000:]


def _done_lines(out: str) -> list[str]:
    return sorted(line for line in out.splitlines() if re.match(r"rank \d+ done:", line))


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


def _errors(diag: dict) -> list[dict]:
    return [f for f in diag["findings"] if f["severity"] == "error" or f["kind"] == "crash"]


def _diagnose(procs: Procs, run_dir: Path) -> tuple[int, dict, str]:
    proc = procs.distdoctor("diagnose", run_dir, "--json")
    code = proc.finish(60)
    _no_traceback(proc.err)
    return code, json.loads(proc.out), proc.err


def _op_counts(run_dir: Path) -> list[int]:
    run = read_incarnations(run_dir)[-1]
    return [len(run.events.get(r, [])) for r in (0, 1)]


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


def _diagnose_any(procs: Procs, run_dir: Path) -> tuple[int, dict, str]:
    """diagnose --json where findings may exist (exit 1)."""
    proc = procs.distdoctor("diagnose", run_dir, "--json")
    code = proc.finish(60)
    return code, (json.loads(proc.out) if code in (0, 1) else {}), proc.err


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


# --- 4. a rank that closes every descriptor gloo does not need ------------------------------

CLOSE_OPS = 300
CLOSE_FILES = 12


def _close_fds_sizes(rank: int) -> list[int]:
    """What tests/jobs/chaos/close_fds.py writes to its file k: k KiB + rank bytes, then k
    bytes every 20th all_reduce from the one where it opened the files."""
    later = sum(1 for i in range(CLOSE_OPS // 3, CLOSE_OPS) if i % 20 == 0)
    return [k * 1024 + rank + k * later for k in range(1, CLOSE_FILES + 1)]


def _files_as_written(folder: Path) -> None:
    for rank in (0, 1):
        sizes = [os.path.getsize(folder / f"rank-{rank}.{k}") for k in range(1, CLOSE_FILES + 1)]
        assert sizes == _close_fds_sizes(rank), (rank, sizes)


@pytest.mark.timeout(200)
def test_a_rank_that_closes_every_descriptor_runs_as_it_does_bare(tmp_path, procs):
    """The job closes distdoctor's descriptors too (the event log's, the mmap's own copy,
    the stack-dump file): the files it opens then get those numbers, and the event log's
    writer, which reserves disk space through its descriptor, must check it is still its
    log before it does."""
    bare_out, traced_out, run_dir = tmp_path / "bare", tmp_path / "traced", tmp_path / "run"
    bare_out.mkdir()
    traced_out.mkdir()
    env = {"CHAOS_OPS": CLOSE_OPS}
    bare = procs.python("-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                        CHAOS / "close_fds.py", env={**env, "CHAOS_OUT": bare_out})
    bare_code = bare.finish(90)
    traced = procs.distdoctor("run", "--nproc", "2", "--run-dir", run_dir, "--grace", "2",
                              "--", CHAOS / "close_fds.py",
                              env={**env, "CHAOS_OUT": traced_out})
    traced_code = traced.finish(90)
    assert bare_code == 0, bare.err[-3000:]
    assert traced_code == bare_code, traced.err[-3000:]
    assert _done_lines(traced.out) == _done_lines(bare.out), (bare.out, traced.out)
    assert len(_done_lines(bare.out)) == 2, bare.out
    _files_as_written(bare_out)
    _files_as_written(traced_out)
    _no_traceback(traced.err)
    code, diag, _ = _diagnose(procs, run_dir)
    assert code == 0 and not _errors(diag), diag
    assert _op_counts(run_dir) == [CLOSE_OPS + 1, CLOSE_OPS + 1]


@pytest.mark.timeout(200)
def test_a_stack_dump_after_the_rank_closed_every_descriptor_misses_the_jobs_files(
        tmp_path, procs):
    out, run_dir = tmp_path / "traced", tmp_path / "run"
    out.mkdir()
    job = procs.distdoctor("run", "--nproc", "2", "--run-dir", run_dir, "--grace", "2", "--",
                           CHAOS / "close_fds.py",
                           env={"CHAOS_OPS": CLOSE_OPS, "CHAOS_OUT": out})
    _until(lambda: (out / f"rank-1.{CLOSE_FILES}").exists(), 60, "the job's files", job)
    pid = json.loads(rank_meta_path(run_dir, 1).read_text())["pid"]
    dump = stacks.dump_stacks({1: pid}, timeout_s=5, use_py_spy=False)[1]
    code = job.finish(90)
    assert code == 0, job.err[-3000:]
    _files_as_written(out)
    assert dump.method == stacks.SIGNAL and "close_fds.py" in dump.text, dump


# --- 5. a rank that forks -------------------------------------------------------------------

FORK_BEFORE = 50


@pytest.fixture(scope="module")
def forked(tmp_path_factory):
    """tests/jobs/chaos/fork_child.py under `distdoctor run`, once per way the child ends,
    with what the rank's log and its stack-dump registration looked like while the parent
    went on after its child had ended."""
    runs: dict[str, SimpleNamespace] = {}

    def run(how: str) -> SimpleNamespace:
        if how in runs:
            return runs[how]
        base = tmp_path_factory.mktemp(f"fork_{how.strip('_.')}").resolve()
        run_dir = base / "run"
        with chaos_procs(base) as procs:
            job = procs.distdoctor("run", "--nproc", "2", "--run-dir", run_dir, "--grace", "2",
                                   "--", CHAOS / "fork_child.py",
                                   env={"CHAOS_FORK_EXIT": how})
            _until(lambda: rank_meta_path(run_dir, 1).exists(), 60, "rank 1's metadata", job)
            pid = json.loads(rank_meta_path(run_dir, 1).read_text())["pid"]
            registered_before = False
            with contextlib.suppress(AssertionError):
                _until(lambda: stacks._registered(pid) is not None, 0.5, "registry")
                registered_before = True
            job.wait_for("the forked child exited with", 60, stream="out")
            log = RankLog(ring_path(run_dir, 1))
            try:
                header = log.header()
            finally:
                log.close()
            registered_after = stacks._registered(pid) is not None
            parent_running = job.poll() is None
            code = job.finish(90)
            runs[how] = SimpleNamespace(
                code=code, out=job.out, err=job.err, run_dir=run_dir, pid=pid,
                header=header, parent_running=parent_running,
                registered_before=registered_before, registered_after=registered_after,
                diagnosis=_diagnose_any(procs, run_dir))
        return runs[how]

    return run


@pytest.mark.timeout(200)
@pytest.mark.parametrize("how", ["sys.exit", "_exit"])
def test_a_rank_that_forks_is_traced_as_the_parent(forked, how):
    got = forked(how)
    assert got.code == 0, got.err[-3000:]
    _no_traceback(got.err)
    assert "rank 1: the forked child exited with 0" in got.out, got.out
    done = _done_lines(got.out)
    after = {int(re.search(r"(\d+) after", line).group(1)) for line in done}
    assert len(done) == 2 and len(after) == 1, got.out
    after = after.pop()
    # while the parent went on after its child had ended, its log was open and its own
    assert got.parent_running
    assert not got.header.closed and got.header.pid == got.pid, got.header
    code, diag, err = got.diagnosis
    assert code == 0, (diag, err)
    _no_traceback(err)
    assert not _errors(diag), diag
    run = read_incarnations(got.run_dir)[-1]
    assert run.incarnations == 1
    assert run.meta[1]["pid"] == run.headers[1].pid == got.pid
    events = run.events[1]
    assert len(events) == FORK_BEFORE + after + 1, len(events)  # and the barrier
    assert all(e.status == "ok" for e in events)
    assert [e.op for e in events[FORK_BEFORE:]] == ["all_reduce"] * after + ["barrier"]
    assert run.headers[1].closed and run.headers[1].exception is None


@pytest.mark.timeout(200)
def test_a_forked_child_that_exits_leaves_the_ranks_stack_dump_registered(forked):
    got = forked("sys.exit")
    assert got.registered_before, "the rank's stack-dump handler was not seen registered"
    assert got.registered_after
