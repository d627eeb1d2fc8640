"""Ranks that start again: each launch is an incarnation with logs of its own, traced,
diagnosed and shown apart; and no reader dies whatever a rank does to its log."""

import json
import os
import sys

import pytest
from conftest import JOBS, run_cli

from distdoctor.runlog.follow import RunFollower
from distdoctor.runlog.incarnations import Incarnations
from distdoctor.runlog.reader import RankLog, ShrunkLog
from distdoctor.runlog.ring import RingWriter
from distdoctor.runlog.run import read_incarnations

pytestmark = pytest.mark.timeout(240)
RESTARTS = JOBS / "restarts"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone",
            "--nproc-per-node", "2"]


def _ops(run, rank, op="all_reduce"):
    return sum(1 for e in run.events[rank] if e.op == op and e.status == "ok")


def test_a_script_that_launches_its_ranks_again_and_again(tmp_path):
    """The loop that killed `distdoctor run` with SIGBUS (each launch truncated the same
    log files under its reader): every phase is an incarnation, nothing mixed."""
    run_dir = tmp_path / "run"
    phases = 3  # (5 in the field report; 3 already reuse the same log files twice)
    loop = (f"for i in $(seq {phases}); do {' '.join(TORCHRUN)} {RESTARTS / 'phase.py'}"
            f" || exit 1; done")
    res = run_cli(["run", "--run-dir", str(run_dir), "--", "bash", "-c", loop],
                  env={"PHASE_OPS": "100"}, run_dir=run_dir, timeout=200)
    assert res.returncode == 0, res.stderr[-3000:]
    runs = read_incarnations(run_dir)
    assert [r.incarnation for r in runs] == list(range(phases))
    for run in runs:
        assert sorted(run.events) == [0, 1]
        assert [_ops(run, r) for r in (0, 1)] == [100, 100]
        assert len({m["pid"] for m in run.meta.values()}) == 2
    pids = [m["pid"] for run in runs for m in run.meta.values()]
    assert len(set(pids)) == 2 * phases  # every launch's own processes
    assert f"{phases} incarnations" in res.stderr
    diag = run_cli(["diagnose", str(run_dir), "--json"])
    assert diag.returncode == 0 and json.loads(diag.stdout)["findings"] == []
    shown = run_cli(["show", str(run_dir), "--incarnation", "2", "--json"])
    data = json.loads(shown.stdout)
    assert (data["incarnation"], data["incarnations"]) == (2, phases)
    assert run_cli(["show", str(run_dir), "--incarnation", "9"]).returncode == 2


def test_a_rank_that_remakes_its_default_group_is_a_new_incarnation(tmp_path):
    run_dir = tmp_path / "run"
    res = run_cli(["run", "--nproc", "2", "--run-dir", str(run_dir), "--",
                   str(RESTARTS / "reinit.py")], run_dir=run_dir)
    assert res.returncode == 0, res.stderr[-3000:]
    first, second = read_incarnations(run_dir)
    assert [_ops(first, r) for r in (0, 1)] == [3, 3]
    assert [_ops(second, r) for r in (0, 1)] == [4, 4]
    assert first.headers[0].closed  # the first log was finished when the second began
    assert first.meta[0]["pid"] == second.meta[0]["pid"]  # one process, two incarnations


def test_an_elastic_restart_is_traced_per_round_and_its_cause_named(tmp_path):
    """torchrun --max-restarts: rank 1 raises in the first round. Gloo's own restarts
    are flaky on this machine (plain torchrun too may fail to reconnect), so the test
    asks that distdoctor passes torchrun's outcome through, not for a given outcome. A
    restarted round whose mesh never connects waits about six gloo timeouts: 6 s each."""
    run_dir = tmp_path / "run"
    res = run_cli(["run", "--run-dir", str(run_dir), "--", *TORCHRUN, "--max-restarts", "1",
                   str(RESTARTS / "phase.py")],
                  env={"PHASE_OPS": "40", "PHASE_FAIL_RANK": "1", "PHASE_TIMEOUT": "6"},
                  run_dir=run_dir, timeout=200)
    assert "Traceback" not in "".join(
        line for line in res.stderr.splitlines(True) if line.startswith("distdoctor"))
    runs = read_incarnations(run_dir)
    assert len(runs) >= 1
    first = runs[0]
    assert {m.get("restart_count") for m in first.meta.values()} == {0}
    if res.returncode == 0:  # the restarted round ran to its end
        assert len(runs) == 2 and [_ops(runs[1], r) for r in (0, 1)] == [40, 40]
        assert {m.get("restart_count") for m in runs[1].meta.values()} == {1}
    found = json.loads(run_cli(["diagnose", str(run_dir), "--json"]).stdout)["findings"]
    cause = [f for f in found if f["kind"] == "crash" and f["severity"] == "error"]
    assert len(cause) == 1, found
    # labelled when the restarted round made logs too (its gloo set-up may have failed)
    assert cause[0]["ranks"] == [1] and cause[0]["details"].get("incarnation", 0) == 0
    assert ("incarnation" in cause[0]["details"]) == (len(runs) > 1)
    assert "RuntimeError: injected failure" in cause[0]["summary"]
    assert cause[0]["callsites"][0]["file"].endswith("phase.py")


def test_no_reader_dies_when_a_rank_shrinks_its_log(tmp_path):
    """A mapped page past the end of a shrunk file is SIGBUS (exit 135); read with
    pread, the readers say so in one line and go on."""
    run_dir = tmp_path / "run"
    res = run_cli(["run", "--nproc", "2", "--run-dir", str(run_dir), "--",
                   str(RESTARTS / "shrink_own_log.py")], run_dir=run_dir)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "r0:unreadable" in res.stderr  # its summary says what it could not read
    assert "Traceback" not in res.stderr
    for cmd in (["diagnose", str(run_dir)], ["show", str(run_dir)],
                ["watch", str(run_dir), "--once"]):
        out = run_cli(cmd)
        assert out.returncode in (0, 1), (cmd, out.stderr)
        assert "Traceback" not in out.stderr and "truncated" in out.stdout + out.stderr, cmd


def test_a_log_is_never_rewritten_in_place(tmp_path):
    """A writer's new log is a new file: a reader of the old one keeps it whole."""
    path = str(tmp_path / "rank-00000.ring")
    old = RingWriter(path, 0, 64 * 128, 4096)
    old.append(1, 1, 0, 0, 0, 0, 0, -1, 0, 1, 1, 5, 0, 0)
    reader = RankLog(path)
    inode = os.stat(path).st_ino
    new = RingWriter(path, 0, 16 * 128, 4096)  # smaller, at the same name
    new.append(1, 1, 0, 0, 0, 0, 7, -1, 0, 1, 1, 5, 0, 0)
    assert os.stat(path).st_ino != inode
    assert [e.seq for e in reader.read()] == [0]  # still the old file
    second = RankLog(path)
    os.truncate(path, 4096)  # someone else's truncation of the new one, under its reader
    with pytest.raises(ShrunkLog):
        second.read()


def test_logs_of_the_same_rank_are_numbered_and_grouped(tmp_path):
    (tmp_path / "ranks").mkdir()
    a = {"store": "tcp://h:1", "world": 2}
    logs = [RingWriter.next_log(str(tmp_path), r, 16 * 128, 4096, launch)
            for launch in (a, a, {"store": "tcp://h:2", "world": 2}) for r in (0, 1)]
    assert [w.log_number for w in logs] == [0, 0, 1, 1, 2, 2]
    follower = RunFollower(tmp_path)
    follower.poll()
    assert {k: f.incarnation for k, f in follower.feeds.items()} == {
        (0, 0): 0, (1, 0): 0, (0, 1): 1, (1, 1): 1, (0, 2): 2, (1, 2): 2}
    # the same store twice (a fixed port, launched again): told apart by order
    numbering = Incarnations()
    assert [numbering.assign(r, a) for r in (0, 1, 0, 1)] == [0, 0, 1, 1]
