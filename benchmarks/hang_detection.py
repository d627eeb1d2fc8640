"""Hang detection with no configuration: time to detection per kind of hang, the fixed
timeout rule beside it, and false hangs on healthy long waits (issue 29).

Real 2-rank gloo jobs under `distdoctor run --on-hang kill` with no --hang-timeout (the
auto rule: progress, not elapsed time). For each hang kind rank 1 notes the wall time
just before it stops making progress; this script polls findings.json until a finding of
severity error names rank 1 (both ranks for a deadlock). The same job is then run under
the fixed rule (--hang-timeout S) for the comparison. Healthy jobs (tests/jobs/waits/
long_waits.py: a real checkpoint on rank 0, evaluation, data preparation, a slow first
step, a DataLoader stall, a library call on one line) run for --long-s seconds each: any
hang finding is a false hang.

  python benchmarks/hang_detection.py [--repeat 2] [--fixed 10] [--long-s 20]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LONG_WAITS = ROOT / "tests" / "jobs" / "waits" / "long_waits.py"

JOB = textwrap.dedent("""
    import datetime, os, queue, signal, sys, threading, time
    import torch, torch.distributed as dist
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
    rank, kind, mark = dist.get_rank(), sys.argv[1], sys.argv[2]
    pair = dist.new_group([0, 1])
    for step in range(3):
        dist.all_reduce(torch.ones(64))
    if rank == 1:
        open(mark, "w").write(repr(time.time()))
        if kind == "compute":
            os.read(os.pipe()[0], 1)  # a native call that never returns
        elif kind == "sleep":
            time.sleep(3600)
        elif kind == "lock":
            lock = threading.Lock(); lock.acquire(); lock.acquire()
        elif kind == "queue":
            queue.Queue().get()
        elif kind == "spin":
            x = 0
            while x >= 0: x += 1
        elif kind == "dead":
            os.kill(os.getpid(), signal.SIGKILL)
        elif kind == "deadlock":
            dist.recv(torch.zeros(4), src=0)
        elif kind == "wrong_group":
            dist.all_reduce(torch.ones(64), group=pair)
    elif kind == "deadlock":
        dist.recv(torch.zeros(4), src=1)
    dist.all_reduce(torch.ones(64))
""")
HANGS = ("compute", "sleep", "lock", "queue", "dead", "deadlock", "wrong_group", "spin")
LONG = ("checkpoint", "evaluate", "prepare", "warmup", "dataloader", "generate")


def _start(run_dir: Path, cmd: list[str], timeout: str | None,
           nproc: int = 2) -> subprocess.Popen:
    extra = ["--hang-timeout", timeout] if timeout else []
    return subprocess.Popen(
        [sys.executable, "-m", "distdoctor", "run", "--nproc", str(nproc), "--run-dir",
         str(run_dir), *extra, "--on-hang", "kill", "--grace", "1", "--", *cmd],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)


def _findings(run_dir: Path) -> list[dict]:
    try:
        return json.loads((run_dir / "findings.json").read_text())["findings"]
    except (OSError, ValueError, KeyError):
        return []


def time_to_finding(job: Path, kind: str, tmp: Path, timeout: str | None, found,
                    nproc: int = 2, limit_s: float = 180, poll_s: float = 0.02) -> float:
    """Run `job KIND MARK` under `distdoctor run`; seconds from the wall time the job wrote
    to MARK (just before it diverges) to the first finding on disk that `found` accepts.
    Also detection_latency.py's."""
    mark, run_dir = tmp / f"mark-{kind}", tmp / f"run-{kind}-{time.time_ns()}"
    mark.unlink(missing_ok=True)
    proc = _start(run_dir, [str(job), kind, str(mark)], timeout, nproc)
    found_at = None
    try:
        deadline = time.time() + limit_s
        while time.time() < deadline and found_at is None:
            if any(found(f) for f in _findings(run_dir)):
                found_at = time.time()
            time.sleep(poll_s)
    finally:
        proc.wait(timeout=120)
    if found_at is None:
        raise SystemExit(f"{kind}: no finding within {limit_s:g} s")
    return found_at - float(mark.read_text())


def detect(kind: str, tmp: Path, timeout: str | None) -> float:
    job = tmp / "job.py"
    job.write_text(JOB)
    return time_to_finding(job, kind, tmp, timeout,
                           lambda f: f["severity"] == "error" and 1 in f["ranks"])


def healthy(kind: str, tmp: Path, seconds: float) -> tuple[int, str]:
    """(the job's exit code, the long-wait finding's summary or what else was found)."""
    run_dir = tmp / f"long-{kind}-{time.time_ns()}"
    proc = _start(run_dir, [str(LONG_WAITS), kind, str(seconds)], None)
    code = proc.wait(timeout=seconds + 120)
    found = _findings(run_dir)
    hangs = [f for f in found if f["kind"] in ("hang", "deadlock")]
    if hangs:
        return code, "FALSE HANG: " + hangs[0]["summary"]
    waits = [f for f in found if f["kind"] == "long_wait"]
    return code, waits[0]["summary"] if waits else "no finding"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--fixed", type=float, default=10.0,
                    help="the fixed rule's timeout for the comparison (seconds)")
    ap.add_argument("--long-s", type=float, default=20.0,
                    help="how long each healthy job keeps a rank waiting")
    ap.add_argument("--kinds", default=",".join(HANGS), help="hang kinds ('' for none)")
    ap.add_argument("--skip-healthy", action="store_true")
    ap.add_argument("--healthy", default=",".join(LONG),
                    help="healthy kinds, each KIND or KIND:SECONDS")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        print(f"{'kind':<12} {'auto (no flag)':>22} {'fixed --hang-timeout ' + format(args.fixed, 'g'):>28}")
        for kind in filter(None, args.kinds.split(",")):
            auto = sorted(detect(kind, tmp, None) for _ in range(args.repeat))
            fixed = detect(kind, tmp, f"{args.fixed:g}")
            print(f"{kind:<12} {', '.join(f'{x:5.1f}' for x in auto) + ' s':>22} "
                  f"{fixed:26.1f} s", flush=True)
        if args.skip_healthy:
            return
        print("\nhealthy jobs (no flag, --on-hang kill):")
        false = 0
        kinds = [k.split(":") for k in args.healthy.split(",")]
        for kind, *seconds in kinds:
            s = float(seconds[0]) if seconds else args.long_s
            code, said = healthy(kind, tmp, s)
            false += said.startswith("FALSE")
            print(f"  {kind:<11} {s:4.0f} s, exit {code}: {said[:150]}", flush=True)
        print(f"false hangs: {false} of {len(kinds)}")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
