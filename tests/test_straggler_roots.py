"""One slow rank, one culprit: the reference trainer with a rank made slow, followed
through its pipeline and DP groups to the root (waitgraph.py), and a healthy run on a
busy machine said as the machine's (host_noise.py). Real gloo jobs under `distdoctor run`.
The whole goals table (every mode and position, 50 noisy healthy runs) is
benchmarks/straggler_roots.py."""

from __future__ import annotations

import json
import os
import sys

import pytest
from conftest import run_cli
from hogs import cpu_hogs

pytestmark = pytest.mark.timeout(200)

TRAINER = "distdoctor.reference_trainer"
SMALL = ["--layers", "4", "--dim", "32", "--heads", "2", "--seq-len", "16", "--vocab", "64",
         "--batch-size", "4", "--log-every", "1000", "--timeout-s", "60"]


def trainer_findings(tmp_path, nproc: int, flags: list[str], steps: int = 24) -> list[dict]:
    run_dir = tmp_path / "run"
    res = run_cli(["run", "--nproc", str(nproc), "--run-dir", str(run_dir), "--grace", "2",
                   "--", sys.executable, "-m", TRAINER, *flags, *SMALL, "--steps", str(steps)],
                  timeout=180, run_dir=run_dir)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads((run_dir / "findings.json").read_text())["findings"]


# name -> (nproc, flags, slow rank, ms per step, its victims at least). 4 ranks share
# this machine's 2 cores: their steps are noisier, so that case runs longer
SLOW = {
    # the last of two stages: only p2p between them, one loss all-reduce a step
    "PP 1f1b, last stage": (2, ["--pp", "2", "--schedule", "1f1b"], 1, 30, {0}),
    # the demo: rank 2 is stage 1 of the first pipeline; rank 0 waits for its
    # activations and gradients, then keeps its DP peer (rank 1) waiting
    "DP x PP, stage 1": (4, ["--dp", "2", "--pp", "2"], 2, 40, {0}),
}


@pytest.mark.parametrize("case", sorted(SLOW))
def test_a_slow_rank_is_the_one_culprit_and_its_victims_are_in_details(case, tmp_path):
    nproc, flags, rank, ms, victims = SLOW[case]
    findings = trainer_findings(tmp_path, nproc,
                                [*flags, "--inject", f"straggler:rank={rank},ms={ms}"],
                                steps=24 if nproc == 2 else 30)
    stragglers = [f for f in findings if f["kind"] == "straggler"]
    assert [f["ranks"] for f in stragglers] == [[rank]], [f["summary"] for f in findings]
    f = stragglers[0]
    d = f["details"]
    assert victims <= set(d["victims"]) and rank not in d["victims"], d
    assert f"it delays rank {min(victims)}" in f["summary"], f["summary"]
    # the cause analysis runs on the root: its own work, at the injected line
    assert d["cause"] == "compute", f["summary"]
    assert d["top_frames"] and d["top_frames"][0]["function"] == "straggle", d["top_frames"]
    assert not [x for x in findings if x["kind"] in ("straggler", "host")
                and x is not f], findings


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_a_healthy_run_beside_many_small_processes_blames_no_rank(tmp_path):
    """TP+SP (the mode the issue saw flagged) beside ten processes of one program, each
    busy ~15% of the time on any core: no one of them is a busy process alone, together
    they take 1.5 cores. Whatever the ranks' lateness, no straggler is blamed on the
    program; when they made a rank late, it is the host's finding, naming that program.
    (One process spinning a whole core: test_stragglers.py's cpu_starved case.)"""
    with cpu_hogs(["any"] * 10, duty=0.15, name="ddsmallhog") as hogs:
        findings = trainer_findings(tmp_path, 2, ["--tp", "2"])
    assert not [f for f in findings if f["kind"] == "straggler"], findings
    for f in findings:
        assert f["kind"] == "host", findings
        named = {b["name"]: b for b in f["details"]["busy_processes"]}
        assert "ddsmallhog" in named, f["details"]
        assert set(named["ddsmallhog"]["pids"]) <= set(hogs)
        assert named["ddsmallhog"]["count"] >= 5, named
        assert f["details"]["host"] in f["summary"] and "ddsmallhog x" in f["summary"]
