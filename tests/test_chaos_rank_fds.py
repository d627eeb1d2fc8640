"""Chaos of a rank's own: it closes every file descriptor gloo does not need (distdoctor's
too), then opens files of its own, which get those numbers. Real processes: gloo on CPU, 2
ranks; the job runs as it does bare, and a stack dump misses the job's files. The
processes and their clean-up: chaosprocs.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from chaosprocs import (
    CHAOS,
    NEEDS_PROC,
    _diagnose,
    _done_lines,
    _errors,
    _no_traceback,
    _op_counts,
    _until,
    procs_fixture,  # noqa: F401  (the procs fixture)
)
from distdoctor.probes import stacks

from distdoctor.runlog.rundir import rank_meta_path

pytestmark = NEEDS_PROC


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
