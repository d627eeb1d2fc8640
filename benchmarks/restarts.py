"""Jobs that start their ranks again, bare and under `distdoctor run`, alternated.

    python benchmarks/restarts.py                 # 6 rounds of each scenario
    python benchmarks/restarts.py --rounds 10 --only elastic

Scenarios (tests/jobs/restarts/phase.py, 2 gloo ranks):
  phases   a shell loop running `torchrun` PHASES times (each launch 300 all_reduces);
           the loop that ended `distdoctor run` with SIGBUS before logs were made new
  elastic  `torchrun --max-restarts 2` where rank 1 raises half way through the first
           round; the second round runs to its end (or not: gloo's reconnection after a
           restart is flaky on this machine, bare as well as traced)

Each round runs the scenario bare, then traced (or the other way round, alternating),
and prints both exit codes and times. What must hold: the traced outcome is the bare
outcome's as often (distdoctor changes no outcome), and each traced run holds one
incarnation per launch. Reported: outcomes, incarnations, median wall time ratio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from distdoctor.runlog.run import read_incarnations

PHASE = Path(__file__).resolve().parent.parent / "tests" / "jobs" / "restarts" / "phase.py"
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone",
            "--nproc-per-node", "2"]
PHASES = 5


def scenario(name: str) -> tuple[list[str], dict, int]:
    """(command, environment, launches expected when it succeeds)"""
    if name == "phases":
        loop = f"for i in $(seq {PHASES}); do {' '.join(TORCHRUN)} {PHASE} || exit 1; done"
        return ["bash", "-c", loop], {"PHASE_OPS": "300"}, PHASES
    return ([*TORCHRUN, "--max-restarts", "2", str(PHASE)],
            {"PHASE_OPS": "100", "PHASE_FAIL_RANK": "1"}, 2)


def once(cmd: list[str], env: dict, run_dir: Path | None, timeout_s: float) -> tuple[str, float]:
    full = [sys.executable, "-m", "distdoctor", "run", "--run-dir", str(run_dir), "--",
            *cmd] if run_dir else cmd
    t0 = time.monotonic()
    proc = subprocess.Popen(full, env={**os.environ, **env}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        code = str(proc.wait(timeout=timeout_s))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 15)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
        code = "hung"
    return code, time.monotonic() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--only", choices=["phases", "elastic"])
    ap.add_argument("--timeout", type=float, default=120.0)
    args = ap.parse_args()
    for name in [args.only] if args.only else ["phases", "elastic"]:
        cmd, env, launches = scenario(name)
        bare, traced, times, incarnations = Counter(), Counter(), [], Counter()
        with tempfile.TemporaryDirectory() as tmp:
            for i in range(args.rounds):
                run_dir = Path(tmp) / f"run{i}"
                order = [None, run_dir] if i % 2 == 0 else [run_dir, None]
                got = {}
                for where in order:
                    got[where is not None] = once(cmd, env, where, args.timeout)
                (b, tb), (t, tt) = got[False], got[True]
                bare[b] += 1
                traced[t] += 1
                times.append(tt / tb)
                n = len(read_incarnations(run_dir)) if (run_dir / "run.json").exists() else 0
                incarnations[n] += 1
                print(f"{name} round {i}: bare exit {b} ({tb:.1f} s), traced exit {t} "
                      f"({tt:.1f} s), {n} incarnation(s)", flush=True)
        print(f"{name}: bare outcomes {dict(bare)}, traced outcomes {dict(traced)}, "
              f"incarnations {dict(incarnations)} (a full run has {launches}), "
              f"median traced/bare time {statistics.median(times):.2f}", flush=True)


if __name__ == "__main__":
    main()
