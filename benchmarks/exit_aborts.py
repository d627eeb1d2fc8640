"""Exit-time aborts, bare against traced: a job run N times under torchrun, then N times
under `distdoctor run -- torchrun`, counting runs whose ranks died of SIGABRT (or any
non-zero exit). The job is a Lightning DDP job that never calls destroy_process_group()
(tests/jobs/frameworks/lightning_steps.py --healthy) unless another is given.

    python benchmarks/exit_aborts.py [--runs 10] [--job PATH -- ARGS...]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
JOB = ROOT / "tests" / "jobs" / "frameworks" / "lightning_steps.py"


def _once(cmd: list[str], timeout: float) -> tuple[int, bool]:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True, cwd=ROOT)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
    text = out.decode("utf-8", "replace")
    aborted = "SIGABRT" in text or "terminate called" in text
    return proc.returncode, aborted


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--timeout", type=float, default=180)
    ap.add_argument("--job", default=str(JOB))
    ap.add_argument("job_args", nargs="*", default=["--healthy"])
    args = ap.parse_args()
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                args.job, *args.job_args]
    for label in ("bare", "traced"):
        aborted = failed = 0
        for _ in range(args.runs):
            if label == "bare":
                cmd = torchrun
            else:
                run_dir = tempfile.mkdtemp(prefix="exit-aborts-")
                os.rmdir(run_dir)
                cmd = [sys.executable, "-m", "distdoctor", "run", "--run-dir", run_dir, "--",
                       *torchrun]
            code, abort = _once(cmd, args.timeout)
            aborted += abort
            failed += code != 0
        print(f"{label}: {aborted}/{args.runs} runs with an exit-time abort, "
              f"{failed}/{args.runs} non-zero exits", flush=True)


if __name__ == "__main__":
    main()
