"""Values code forgets, each refused in one line before anything runs: nan and inf where
seconds go (nan passes every `<= 0` test: `run --hang-timeout nan` never found a hang,
`check --timeout nan` failed every rank at once), an --nproc no machine runs (10 GB of
environments before the first process), an output that is a device or a FIFO (written
under a temporary name and renamed over it: as root, `--perfetto /dev/null` replaced the
machine's /dev/null), a log that is a pipe with no writer (open() blocked for ever) or
/dev/zero (read for ever), and a Flight Recorder dump read up to its 1 GiB bound before
being refused."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import run_cli


def _one_line_refusal(args: list[str], timeout: float = 30, **kw) -> str:
    res = run_cli(args, timeout=timeout, **kw)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == 2 and "Traceback" not in res.stderr, (args, res.stderr[-2000:])
    assert len(lines) == 1 and lines[0].startswith("distdoctor: error:"), (args, res.stderr)
    return lines[0]


@pytest.mark.parametrize("args", [
    ["run", "--hang-timeout", "nan", "--", "true"],
    ["run", "--hang-timeout", "inf", "--", "true"],
    ["run", "--grace", "nan", "--", "true"],
    ["run", "--grace", "-1", "--", "true"],
    ["diagnose", "--hang-timeout", "nan", "--log", "x.log"],
    ["watch", "--refresh", "nan", "--once"],
    ["check", "--nproc", "1", "--timeout", "nan"],
    ["demo", "--hang-timeout", "nan"],
])
def test_seconds_that_are_not_a_number_are_refused(args, tmp_path):
    assert "seconds" in _one_line_refusal(args, cwd=tmp_path)


@pytest.mark.parametrize("command", [["run"], ["check"], ["demo"], ["nccl-test"]])
def test_an_nproc_no_machine_runs_is_refused_before_anything_is_built(command, tmp_path):
    args = [*command, "--nproc", "99999999999999999999"]
    if command == ["run"]:
        args += ["--", "true"]
    assert "at most 4096" in _one_line_refusal(args, timeout=20, cwd=tmp_path)


def test_an_output_that_is_a_fifo_or_a_device_is_left_as_it_is(tmp_path, good_run):
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    targets = [fifo]
    if os.geteuid() == 0:  # a character device like /dev/null (1, 3), made here
        dev = tmp_path / "null"
        os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        targets.append(dev)
    for target in targets:
        kind = stat.S_IFMT(os.stat(target).st_mode)
        for args in (["export", str(good_run), "--perfetto", str(target)],
                     ["pack", str(good_run), "-o", str(target)]):
            assert "not a regular file" in _one_line_refusal(args)
            assert stat.S_IFMT(os.stat(target).st_mode) == kind, (args, target)
    assert "needs a file name" in _one_line_refusal(
        ["export", str(good_run), "--perfetto", ""])


def test_a_log_that_is_a_pipe_or_a_device_is_refused_not_read_for_ever(tmp_path):
    fifo = tmp_path / "job.log"
    os.mkfifo(fifo)  # nobody writes it: opening it blocked
    for log in (str(fifo), "/dev/zero"):
        assert "not a regular file" in _one_line_refusal(["diagnose", "--log", log])
    assert "needs a file name" in _one_line_refusal(["diagnose", "--log", ""])


def test_a_dump_over_the_bound_is_refused_by_its_size_not_read(tmp_path):
    prefix = tmp_path / "nccl_trace_rank_"
    with open(f"{prefix}0", "wb") as f:
        f.truncate(2 << 30)  # 2 GiB, sparse
    code = ("import resource, subprocess, sys\n"
            "r = subprocess.run([sys.executable, '-m', 'distdoctor', 'diagnose', '--fr-dump',"
            f" {str(prefix)!r}], capture_output=True, text=True, timeout=60)\n"
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, r.returncode)\n"
            "print(r.stdout[-2000:], r.stderr[-2000:])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=90, stdin=subprocess.DEVNULL).stdout
    rss_kb, code_ = map(int, out.split("\n", 1)[0].split())
    assert rss_kb < 300_000, out  # read whole, it took 1.07 GB
    assert "over 1024 MiB" in out and "Traceback" not in out, out


@pytest.fixture(scope="module")
def good_run(tmp_path_factory) -> Path:
    from conftest import run_job

    run_dir = tmp_path_factory.mktemp("good") / "run"
    assert run_job("many_ops.py", 2, run_dir, "5").returncode == 0
    return run_dir


def test_a_bad_fault_for_the_demo_is_one_line_before_any_rank_starts(tmp_path):
    line = _one_line_refusal(["demo", "--no-dashboard", "--inject", "garbage"], cwd=tmp_path)
    assert "unknown kind 'garbage'" in line  # (13 lines from 8 started ranks before)
    assert not (tmp_path / "distdoctor-runs").exists()


def test_an_empty_output_name_for_nccl_test_is_refused(tmp_path):
    for flag in ("--csv", "--json"):
        line = _one_line_refusal(["nccl-test", "--nproc", "1", flag, ""], cwd=tmp_path)
        assert f"{flag} needs a file name" in line
