"""Each failure the reference trainer injects is diagnosed: the right kind, the right
rank, the culprit's line; a healthy traced run of each parallel mode has no finding and
the same losses as untraced."""

from __future__ import annotations

import json
import re
import sys

import pytest
from conftest import run_cli
from distdoctor.reference_trainer.launch import launch

TRAINER = [sys.executable, "-m", "distdoctor.reference_trainer"]

# injection -> (finding kind, culprit rank, file the culprit's call site is in)
INJECTIONS = {
    "mismatch:rank=2,step=3": ("mismatch", 2, "faults.py"),
    "shape:rank=1,step=3": ("mismatch", 1, "faults.py"),
    "skip:rank=3,step=2": ("hang", 3, None),
    "hang:rank=2,step=3": ("hang", 2, "faults.py"),  # from its stack
    "crash:rank=1,step=3": ("crash", 1, "train.py"),
}


def _traced(tmp_path, nproc, *trainer_args, hang_timeout="5", timeout=200):
    run_dir = tmp_path / "run"
    proc = run_cli(["run", "--nproc", str(nproc), "--run-dir", str(run_dir), "--grace", "2",
                    "--hang-timeout", hang_timeout, "--on-hang", "kill", "--",
                    *TRAINER, *trainer_args, "--timeout-s", "60"],
                   timeout=timeout, run_dir=run_dir)
    findings = json.loads((run_dir / "findings.json").read_text())["findings"]
    return proc, findings


@pytest.mark.timeout(240)
@pytest.mark.parametrize("inject", sorted(INJECTIONS))
def test_injected_failure_is_diagnosed(inject, tmp_path):
    kind, rank, site_file = INJECTIONS[inject]
    proc, findings = _traced(tmp_path, 4, "--dp", "2", "--tp", "2", "--steps", "5",
                             "--inject", inject)
    described = "\n".join(f"{f['kind']} {f['severity']} {f['ranks']} {f['summary']}"
                          for f in findings)
    assert proc.returncode != 0
    main = [f for f in findings if f["severity"] == "error"]
    assert main and main[0]["kind"] == kind and main[0]["ranks"] == [rank], described
    for f in main:  # no error finding blames a healthy rank
        assert set(f["ranks"]) <= {rank}, described
    sites = [c for c in main[0]["callsites"] if c["rank"] == rank]
    assert sites and sites[0]["file"] and sites[0]["line"], described
    if site_file:
        assert sites[0]["file"].endswith(site_file), described
    if kind == "crash":  # the step the rank died in, as the trainer counts it
        step = re.search(r"step=(\d+)", inject).group(1)
        assert main[0]["details"]["span"] == f"step {step}", main[0]["summary"]
    if kind in ("mismatch", "hang"):
        step = re.search(r"step=(\d+)", inject).group(1)
        spans = json.dumps(main[0]["details"])
        assert f"step {step}" in spans or f"step {int(step) + 1}" in spans, spans


@pytest.mark.timeout(240)
@pytest.mark.parametrize("mode", [["--dp", "2"], ["--fsdp", "2"], ["--tp", "2"],
                                  ["--pp", "2"], ["--dp", "2", "--ep", "2", "--experts", "4"]])
def test_healthy_mode_has_no_findings_and_same_losses(mode, tmp_path):
    steps = ["--steps", "6"]
    proc, findings = _traced(tmp_path, 2, *mode, *steps, hang_timeout="30")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert findings == [], findings
    plain = launch(2, [*mode, *steps, "--timeout-s", "60"], timeout_s=150, start="forkserver")
    assert plain.returncodes == [0, 0]

    def losses(out):
        return re.findall(r"loss ([0-9.]+)", out)

    # bit-identical results with and without tracing (the log prints 6 decimals)
    assert losses(proc.stdout) and losses(proc.stdout) == losses(plain.stdout[0])


@pytest.mark.timeout(240)
@pytest.mark.parametrize("inject,rank", [("straggler:rank=1,ms=150", 1),
                                         ("throttle:rank=2,factor=1.5", 2)])
def test_slow_rank_is_the_straggler(inject, rank, tmp_path):
    proc, findings = _traced(tmp_path, 4, "--dp", "2", "--tp", "2", "--steps", "20",
                             "--inject", inject, hang_timeout="30")
    assert proc.returncode == 0, proc.stderr[-2000:]
    stragglers = [f for f in findings if f["kind"] == "straggler"]
    assert [f["ranks"] for f in stragglers] == [[rank]], findings
    assert stragglers[0]["details"]["step_lateness_ms"] > 2
    assert not [f for f in findings if f["severity"] == "error"], findings
    assert "STRAGGLER" in proc.stderr  # printed live, while the job ran
