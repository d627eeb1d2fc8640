"""Reference trainer: each injected fault produces the failure it promises, in bounded time;
bad flags end in one line and a non-zero exit.

Every multi-rank job runs with a short process-group timeout (TIMEOUT_S), so a hung
collective turns into an error within seconds, and under a launcher deadline on top.
No assertion depends on how long anything took.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys

import pytest
from distdoctor.reference_trainer import main
from distdoctor.reference_trainer.config import parse_config
from distdoctor.reference_trainer.faults import FaultSpecError, parse_inject, validate
from distdoctor.reference_trainer.launch import launch

TIMEOUT_S = "5"
BASE = ["--steps", "5", "--layers", "2", "--dim", "32", "--seq-len", "16", "--vocab", "64",
        "--batch-size", "4", "--timeout-s", TIMEOUT_S]


def run(nproc: int, *args: str):
    return launch(nproc, [*BASE, *args], timeout_s=90, start="forkserver")


def logged_steps(result) -> list[int]:
    return [s["step"] for s in result.steps()]


# --- faults that break the job ----------------------------------------------------------------


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["mismatch", "shape"])
def test_collective_mismatch_fails_the_job_at_the_injected_step(kind):
    result = run(2, "--dp", "2", "--inject", f"{kind}:rank=1,step=3")
    assert not result.timed_out, result.tail()
    assert any(rc != 0 for rc in result.returncodes), result.tail()
    assert f"[rank 1] inject {kind} at step 3" in result.stderr[1]
    assert logged_steps(result)[:2] == [1, 2]
    assert "step 5/5" not in result.stdout[0]  # the job never finishes


@pytest.mark.timeout(120)
def test_skip_desyncs_the_culprit_then_hangs_the_others():
    result = run(2, "--dp", "2", "--inject", "skip:rank=1,step=3")
    assert not result.timed_out, result.tail()
    assert "[rank 1] inject skip at step 3" in result.stderr[1]
    # Rank 0 waits in step 3's all-reduce until the process-group timeout ...
    assert "[rank 0] reference_trainer: step 3 failed" in result.stderr[0], result.tail()
    assert "Timed out" in result.stderr[0]
    # ... while the culprit has already moved on to step 4: desynchronised.
    assert "[rank 1] reference_trainer: step 4 failed" in result.stderr[1], result.tail()
    assert result.returncodes == [1, 1]


@pytest.mark.timeout(120)
def test_hang_blocks_the_culprit_and_times_out_the_others():
    result = run(2, "--dp", "2", "--inject", "hang:rank=1,step=2")
    assert not result.timed_out, result.tail()
    assert "[rank 1] inject hang at step 2" in result.stderr[1]
    assert "step 2 failed" in result.stderr[0] and "Timed out" in result.stderr[0]
    assert result.returncodes[0] == 1
    assert result.stopped == [1]  # still "computing" when the launcher stopped the job
    assert "failed" not in result.stderr[1]


@pytest.mark.timeout(120)
def test_crash_kills_the_culprit_with_sigkill():
    result = run(2, "--dp", "2", "--inject", "crash:rank=1,step=3")
    assert not result.timed_out, result.tail()
    assert result.returncodes[1] == -signal.SIGKILL
    assert result.returncodes[0] != 0
    assert "[rank 1] inject crash at step 3" in result.stderr[1]
    assert logged_steps(result) == [1, 2]


# --- faults that slow the job: it completes, with the same losses, and says what it did ------


@pytest.mark.timeout(120)
def test_straggler_sleeps_before_the_chosen_steps_and_changes_no_result():
    clean = run(2, "--dp", "2")
    result = run(2, "--dp", "2", "--inject", "straggler:rank=1,ms=50,every=2")
    assert clean.ok and result.ok, result.tail()
    records = [line for line in result.stderr[1].splitlines() if "inject straggler" in line]
    assert [r.split("step ")[1].split(":")[0] for r in records] == ["2", "4"]
    assert "inject" not in result.stderr[0]
    assert [s["loss"] for s in result.steps()] == [s["loss"] for s in clean.steps()]


@pytest.mark.timeout(120)
def test_slowlink_delays_both_directions_of_one_hop():
    result = run(2, "--pp", "2", "--inject", "slowlink:stage=0,ms=20")
    assert result.ok, result.tail()
    assert "forward send of stage 0 (hop 0 <-> 1) leaves 20 ms late" in result.stderr[0]
    assert "backward send of stage 1 (hop 0 <-> 1) leaves 20 ms late" in result.stderr[1]


@pytest.mark.timeout(120)
def test_throttle_is_labelled_as_a_simulation_everywhere():
    result = run(2, "--dp", "2", "--inject", "throttle:rank=1,factor=2")
    assert result.ok, result.tail()
    records = [line for out in (result.stdout[0], result.stderr[1]) for line in out.splitlines()
               if "throttle" in line]
    assert len(records) == 2, result.tail()
    assert all("SIMULATED" in line for line in records)
    assert "throttle" not in result.stderr[0]


# --- bad flags: one line, non-zero exit, no traceback -----------------------------------------


def parse_error(capsys, argv: list[str], world_size: int) -> str:
    env = {"WORLD_SIZE": str(world_size), "RANK": "0", "LOCAL_RANK": "0",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}  # never used: flags fail first
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        code = main(argv)
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    captured = capsys.readouterr()
    assert code == 2
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("reference_trainer: error: ")
    return lines[0]


@pytest.mark.parametrize("argv,world,expected", [
    (["--dp", "2", "--tp", "2"], 8, "= 4 rank(s), but the job has WORLD_SIZE=8"),
    (["--dp", "2"], 1, "WORLD_SIZE=1"),
    (["--cp", "2"], 2, "context parallelism is not available"),
    (["--dp", "2", "--inject", "oops:rank=1"], 2, "unknown kind 'oops'"),
    (["--dp", "2", "--inject", "hang:rank=1,when=3"], 2, "unknown key 'when' for hang"),
    (["--dp", "2", "--inject", "hang:rank=1"], 2, "hang needs step"),
    (["--dp", "2", "--inject", "crash:rank=2,step=1"], 2, "rank 2 is out of range"),
    (["--dp", "2", "--inject", "crash:rank=1,step=99"], 2, "step 99 is outside 1..20"),
    (["--dp", "2", "--inject", "slowlink:stage=0,ms=5"], 2, "slowlink needs pipeline stages"),
    (["--schedule", "zigzag"], 1, "invalid choice: 'zigzag'"),
    (["--dp", "x"], 1, "invalid int value: 'x'"),
])
def test_bad_flags_end_in_one_line(capsys, argv, world, expected):
    assert expected in parse_error(capsys, argv, world)


def test_a_world_size_without_a_rendezvous_is_a_usage_error(capsys, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    for key in ("RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    assert main(["--dp", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "MASTER_ADDR, MASTER_PORT not: launch with torchrun" in err


def test_inject_specs_parse_and_validate():
    f = parse_inject("straggler:rank=3,ms=200")
    assert (f.kind, f.rank, f.ms, f.every) == ("straggler", 3, 200, 1)
    assert str(f) == "straggler:rank=3,ms=200,every=1"
    with pytest.raises(FaultSpecError, match="not a number"):
        parse_inject("throttle:rank=1,factor=hot")
    with pytest.raises(FaultSpecError, match="hops are 0..0"):
        validate([parse_inject("slowlink:stage=1,ms=5")], world_size=2, steps=5, num_stages=2)
    cfg = parse_config(["--pp", "2", "--schedule", "interleaved1f1b",
                        "--inject", "slowlink:stage=2,ms=5"], world_size=2)
    assert cfg.num_stages == 4  # interleaved: hops 0..2 exist


@pytest.mark.timeout(60)
def test_bad_flags_from_the_command_line_print_no_traceback():
    env = {**os.environ, "WORLD_SIZE": "4", "RANK": "0", "LOCAL_RANK": "0",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    proc = subprocess.run([sys.executable, "-m", "distdoctor.reference_trainer", "--dp", "3"],
                          capture_output=True, text=True, env=env, timeout=50)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0, proc.stderr
    assert "--dp 3 = 3 rank(s), but the job has WORLD_SIZE=4" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.timeout(150)
@pytest.mark.skipif(shutil.which("torchrun") is None, reason="torchrun not on PATH")
def test_runs_under_torchrun():
    proc = subprocess.run(
        ["torchrun", "--standalone", "--nproc-per-node", "2", "-m",
         "distdoctor.reference_trainer", *BASE, "--dp", "2", "--steps", "2"],
        capture_output=True, text=True, timeout=140, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("| loss ") == 2  # rank 0 logs, the other rank stays quiet
