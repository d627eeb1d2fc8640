"""The goals table of issue 30: mode x position of a slow rank -> findings, and the false
alarms of healthy runs beside a CPU hog.

Each row runs the reference trainer under `distdoctor run` for --steps steps with one rank
made --ms slower per step (`--inject straggler:rank=R,ms=MS`) and reads findings.json:
the row passes when there is exactly one straggler finding, naming that rank (a host
finding beside it, this shared machine's other load, is shown apart). Then --healthy runs of the modes in turn, each beside a process that spins on
the ranks' second core: a false alarm is any straggler finding (a host finding naming the
hog is the right answer where the hog made a rank late, and is counted apart).

    python benchmarks/straggler_roots.py [--steps 20] [--ms 20] [--healthy 50]

With more ranks than cores every rank time-slices (this machine: 2 cores): the 4- and
8-rank rows measure the detector under that noise; a core per rank is the real setting.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from distdoctor.reference_trainer.config import PARALLEL_MODES

SMALL = ["--layers", "4", "--dim", "32", "--heads", "2", "--seq-len", "16", "--vocab", "64",
         "--batch-size", "8", "--log-every", "1000", "--timeout-s", "90"]
# mode -> (nproc, flags): the trainer's modes but the two-mode combinations
MODES = {name: mode for name, mode in PARALLEL_MODES.items() if name not in ("DP x PP", "DP x TP")}
# (mode, position, slow rank)
ROWS = [("DDP", "DP rank", 1), ("FSDP2", "FSDP shard", 1), ("HSDP", "shard of replica 1", 3),
        ("TP+SP", "TP member", 1), ("PP gpipe", "first stage", 0),
        ("PP gpipe", "last stage", 1), ("PP 1f1b", "first stage", 0),
        ("PP 1f1b", "last stage", 1), ("PP interleaved", "first stage", 0),
        ("PP interleaved", "last stage", 1), ("DDP+EP", "EP member", 1),
        ("8-rank", "first stage, TP member", 1), ("8-rank", "last stage, EP member", 6)]


def run(args, nproc: int, flags: list[str], hog: bool = False) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="dd-roots-") as tmp:
        run_dir = os.path.join(tmp, "run")
        spin = None
        if hog:
            core = sorted(os.sched_getaffinity(0))[-1]
            spin = subprocess.Popen([sys.executable, "-c", "import os\n"
                                     f"os.sched_setaffinity(0, {{{core}}})\nwhile True: pass"])
        try:
            subprocess.run([sys.executable, "-m", "distdoctor", "run", "--nproc", str(nproc),
                            "--run-dir", run_dir, "--grace", "2", "--", sys.executable, "-m",
                            args.trainer, *flags, *SMALL, "--steps", str(args.steps)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           stdin=subprocess.DEVNULL, cwd=args.cwd, timeout=600)
        finally:
            if spin is not None:
                spin.kill()
                spin.wait()
        try:
            with open(os.path.join(run_dir, "findings.json")) as f:
                return json.load(f)["findings"]
        except (OSError, ValueError):
            return [{"kind": "no findings.json", "ranks": [], "details": {}}]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--ms", type=int, default=20)
    ap.add_argument("--healthy", type=int, default=50)
    ap.add_argument("--only", default="", help="run the rows of these modes (comma list)")
    ap.add_argument("--trainer", default="distdoctor.reference_trainer")
    ap.add_argument("--cwd", default=None)
    args = ap.parse_args()
    only = set(filter(None, args.only.split(",")))
    print(f"reference trainer, {args.steps} steps, slow rank +{args.ms} ms per step; "
          f"{os.cpu_count()} cores")
    print("| mode | slow rank (position) | straggler findings | victims | verdict |")
    print("|---|---|---|---|---|")
    ok = total = 0
    for mode, position, rank in ROWS:
        if only and mode not in only:
            continue
        nproc, flags = MODES[mode]
        t0 = time.time()
        found = run(args, nproc, [*flags, "--inject", f"straggler:rank={rank},ms={args.ms}"])
        strag = [f for f in found if f["kind"] == "straggler"]
        good = [f["ranks"] for f in strag] == [[rank]]
        hosts = sum(f["kind"] == "host" for f in found)
        ok += good
        total += 1
        victims = strag[0]["details"].get("victims") if len(strag) == 1 else "-"
        print(f"| {mode} | {rank} ({position}) | {[f['ranks'] for f in strag]} | {victims} "
              f"| {'one culprit' if good else 'MISS'}"
              f"{f' (+{hosts} host)' if hosts else ''} ({time.time() - t0:.0f} s) |",
              flush=True)
    if total:
        print(f"found exactly the slow rank in {ok}/{total} rows")
    false = host = 0
    names = [m for m in MODES if not only or m in only]
    for i in range(args.healthy):
        mode = names[i % len(names)]
        nproc, flags = MODES[mode]
        found = run(args, nproc, flags, hog=True)
        strag = [f for f in found if f["kind"] == "straggler"]
        false += bool(strag)
        host += any(f["kind"] == "host" for f in found)
        if strag:
            print(f"  false alarm: healthy {mode}: {strag[0]['summary'][:200]}", flush=True)
    if args.healthy:
        print(f"healthy runs beside a CPU hog: {false}/{args.healthy} with a straggler "
              f"finding (false alarm rate {false / args.healthy:.0%}); {host} with a host "
              f"finding naming the busy processes")


if __name__ == "__main__":
    main()
