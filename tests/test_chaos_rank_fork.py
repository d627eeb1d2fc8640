"""Chaos of a rank's own: it forks mid-job, and its child ends by sys.exit or os._exit. Real
processes: gloo on CPU, 2 ranks; the rank is traced as the parent it is, its log open and
its own while it goes on, and its stack-dump handler stays registered. The processes and
their clean-up: chaosprocs.py."""

from __future__ import annotations

import contextlib
import json
import re
from types import SimpleNamespace

import pytest
from chaosprocs import (
    CHAOS,
    NEEDS_PROC,
    _diagnose_any,
    _done_lines,
    _errors,
    _no_traceback,
    _until,
    chaos_procs,
)
from distdoctor.probes import stacks

from distdoctor.runlog.reader import RankLog
from distdoctor.runlog.run import read_incarnations
from distdoctor.runlog.rundir import rank_meta_path, ring_path

pytestmark = NEEDS_PROC


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
