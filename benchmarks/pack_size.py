"""How small and how fast `distdoctor pack` is (issue 52).

Goals: a pack no larger than `tar --sparse -czf` of the same run dir (with its kept
sources); a simulated run of 1,024 ranks x 1,000 ops a rank packed in under 30 s.

1. The 8-rank demo (`distdoctor demo --no-dashboard`, its defaults; or --demo-run DIR, a
   run dir it made): the pack's size beside `tar --sparse -czf`'s, both timed, and
   `diagnose --json` on the pack against the run dir's (the same findings).
2. A simulated run: RANKS ranks, each log at the default size (60 MiB ring, 4 MiB of
   strings: sparse), OPS ops a rank written as the tracer writes them (a world
   all_reduce and an 8-rank all_gather in turn, three call sites, a step span every 10
   ops, jittered times), run.json and each rank's metadata. `distdoctor pack` on it,
   timed as a user runs it (wall clock, the command's start included); tar beside it.

  python benchmarks/pack_size.py [--demo-run DIR] [--ranks 1024] [--ops 1000] [--no-tar]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from distdoctor.runlog import format as F
from distdoctor.runlog import rundir
from distdoctor.runlog.ring import RingWriter

DD = [sys.executable, "-m", "distdoctor"]


def _timed(cmd: list[str], **kw) -> tuple[float, subprocess.CompletedProcess]:
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    took = time.perf_counter() - start
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return took, proc


def pack_and_tar(run_dir: Path, out: Path, tar: bool = True) -> dict:
    pack = out / "run.ddpack"
    took, proc = _timed(DD + ["pack", str(run_dir), "-o", str(pack)])
    row = {"pack_bytes": pack.stat().st_size, "pack_s": round(took, 2),
           "pack_said": proc.stderr.strip().splitlines()[-1]}
    if tar:
        tgz = out / "run.tgz"
        took, _ = _timed(["tar", "--sparse", "-czf", str(tgz), "-C", str(run_dir), "."])
        row.update(tar_bytes=tgz.stat().st_size, tar_s=round(took, 2),
                   ratio=round(row["pack_bytes"] / tgz.stat().st_size, 3))
    return row


def same_findings(run_dir: Path, pack: Path) -> bool:
    a = json.loads(_timed(DD + ["diagnose", str(run_dir), "--json"])[1].stdout)
    b = json.loads(_timed(DD + ["diagnose", str(pack), "--json"])[1].stdout)
    return a["findings"] == b["findings"]


def demo(args, work: Path) -> dict:
    run_dir = Path(args.demo_run) if args.demo_run else work / "demo"
    if not args.demo_run:
        took, _ = _timed(DD + ["demo", "--no-dashboard", "--run-dir", str(run_dir)],
                         timeout=900)
        print(f"demo ran in {took:.0f} s", file=sys.stderr)
    row = pack_and_tar(run_dir, work)
    kept = run_dir / "sources"
    row["kept_sources"] = sum(p.stat().st_size for p in kept.glob("*.src")) if \
        kept.is_dir() else 0
    row["same_findings"] = same_findings(run_dir, work / "run.ddpack")
    return row


def simulate(run_dir: Path, ranks: int, ops: int, seed: int = 52) -> float:
    """The simulated run; seconds it took to write."""
    rng = random.Random(seed)
    start = time.perf_counter()
    rundir.write_run_meta(run_dir, launcher="distdoctor run", command=["train.py"],
                          nproc=ranks, world_size=ranks, hang_timeout_s=None)
    world = list(range(ranks))
    sites = [{"file": "/job/train.py", "line": n, "function": f,
              "callers": [{"file": "/job/train.py", "line": 301, "function": "<module>"}]}
             for n, f in ((88, "step"), (97, "step"), (140, "evaluate"))]
    for r in range(ranks):
        w = RingWriter(str(rundir.ring_path(run_dir, r)), r, 60 << 20, 4 << 20,
                       launch={"store": "tcp://node0:29500", "world": ranks})
        base = r - r % 8
        world_g = w.add_string({"name": "0", "desc": "default_pg", "ranks": world})
        tp_g = w.add_string({"name": "1", "desc": "tp", "ranks": list(range(base, base + 8))})
        tensors = [w.add_string({"shapes": [[n]], "dtypes": ["bfloat16"], "device": "cuda:0"})
                   for n in (4096, 1 << 20)]
        site_ids = [w.add_string(s) for s in sites]
        step_name = w.add_string("step")
        t = 1_000_000_000 + rng.randrange(10**6)
        span = 0
        for i in range(ops):
            if i % 10 == 0:
                e = w.append(F.KIND_SPAN, F.OP_CODE["span"], F.REDOP_NONE, F.FLAG_IMPLICIT, 0,
                             site_ids[0], i // 10, -1, 0, 0, 0, t, 0, step_name)
                w.complete(e, F.STATUS_OK, t + 40_000_000 + rng.randrange(10**6))
                span = e + 1
            t += 200_000 + rng.randrange(50_000)
            if i % 2 == 0:
                group, op, seq, redop, numel = world_g, "all_reduce", i // 2, 0, 1 << 20
                tensor = tensors[1]
            else:
                group, op, seq, redop, numel = tp_g, "all_gather_into_tensor", i // 2, \
                    F.REDOP_NONE, 4096
                tensor = tensors[0]
            e = w.append(F.KIND_COLLECTIVE, F.OP_CODE[op], redop, 0, group,
                         site_ids[(i // 2) % 2 if i % 50 else 2], seq, -1, tensor, numel,
                         numel * (8 if i % 2 else 1), t, span, 0)
            t += 1_000_000 + rng.randrange(300_000)
            w.complete(e, F.STATUS_OK, t)
        w.heartbeat()
        w.mark_closed()
        w.close()
        rundir.write_json_atomic(rundir.rank_meta_path(run_dir, r),
                                 {"rank": r, "world_size": ranks, "local_rank": r % 8,
                                  "host": f"node{r // 8}", "pid": 10_000 + r,
                                  "backend": "nccl", "torch": "2.13.0"})
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--demo-run", metavar="DIR", help="a run dir `distdoctor demo` made")
    ap.add_argument("--no-demo", action="store_true")
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--ops", type=int, default=1000)
    ap.add_argument("--no-tar", action="store_true", help="no tar of the simulated run")
    ap.add_argument("--work", metavar="DIR", help="where to write (default: a temp dir)")
    args = ap.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="pack-size-"))
    work.mkdir(parents=True, exist_ok=True)
    out = {}
    try:
        if not args.no_demo:
            (work / "d").mkdir(exist_ok=True)
            out["demo"] = demo(args, work / "d")
            print(json.dumps({"demo": out["demo"]}), flush=True)
        sim = work / "sim"
        made = simulate(sim, args.ranks, args.ops)
        (work / "s").mkdir(exist_ok=True)
        row = pack_and_tar(sim, work / "s", tar=not args.no_tar)
        row.update(ranks=args.ranks, ops=args.ops, written_s=round(made, 1),
                   apparent_gib=round(sum(p.stat().st_size for p in (sim / "ranks").iterdir())
                                      / 2**30, 1),
                   load=round(os.getloadavg()[0], 1), goal_s=30)
        out["simulated"] = row
        print(json.dumps({"simulated": row}), flush=True)
    finally:
        if not args.work:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
