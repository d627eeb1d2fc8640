"""Healthy framework jobs, traced: how many runs give an error or warning finding (a
`host` finding for a busy machine is allowed: it names the machine, not the program).

    python benchmarks/framework_healthy.py [--runs 20] [--case NAME] [--iters N] [--busy K]

--busy K: K other processes spin on any core while the jobs run (a machine busy with
other work, as users' healthy jobs met it in issue 34).

Jobs (tests/jobs/frameworks/): nanogpt_style.py (rank 0 alone evaluates and checkpoints
every 25 iterations), and the --healthy twins of lightning_steps.py (Lightning DDP, its
sanity check), lightning_rank0_checkpoint.py (every rank saves a checkpoint through
Lightning's barrier each epoch), hf_trainer_steps.py (HF Trainer, accumulation) and
accelerate_steps.py.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
JOBS = ROOT / "tests" / "jobs" / "frameworks"
CASES = {"nanogpt_style": [str(JOBS / "nanogpt_style.py"), "--iters", "150"],
         "lightning": [str(JOBS / "lightning_steps.py"), "--healthy"],
         "lightning_checkpoint": [str(JOBS / "lightning_rank0_checkpoint.py"), "--healthy"],
         "hf_trainer": [str(JOBS / "hf_trainer_steps.py"), "--healthy"],
         "accelerate": [str(JOBS / "accelerate_steps.py"), "--healthy"]}


def _once(job: list[str], timeout: float) -> list[dict]:
    run_dir = Path(tempfile.mkdtemp(prefix="framework-healthy-")) / "run"
    cmd = [sys.executable, "-m", "distdoctor", "run", "--run-dir", str(run_dir), "--",
           sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", *job]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True, cwd=ROOT)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return [{"kind": "timeout", "severity": "error", "summary": "run timed out"}]
    try:
        return json.loads((run_dir / "findings.json").read_text())["findings"]
    except (OSError, ValueError):
        return []


# a process that spins on whatever core the scheduler gives it (another job's work)
SPIN = "while True:\n    pass\n"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--case", choices=sorted(CASES), action="append")
    ap.add_argument("--iters", type=int, default=150, help="nanogpt_style's iterations")
    ap.add_argument("--busy", type=int, default=0, help="spinning processes beside the jobs")
    args = ap.parse_args()
    CASES["nanogpt_style"][2] = str(args.iters)
    spins = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(args.busy)]
    try:
        _cases(args)
    finally:
        for spin in spins:
            spin.kill()
            spin.wait()


def _cases(args) -> None:
    for name in args.case or sorted(CASES):
        bad, kinds = 0, Counter()
        for _ in range(args.runs):
            found = [f for f in _once(CASES[name], args.timeout)
                     if f["severity"] in ("error", "warning") and f["kind"] != "host"]
            bad += bool(found)
            kinds.update(f["kind"] for f in found)
        print(f"{name}: {bad}/{args.runs} healthy runs with an error or warning finding "
              f"{dict(kinds) or ''}".rstrip(), flush=True)


if __name__ == "__main__":
    main()
