"""PyTorch's own distributed test suite, bare and under `distdoctor run` (numbers go in
docs/benchmarks.md).

The wider sibling of tests/test_torch_suite.py: every test of torch's `_DistTestBase`
(tests/jobs/torch_suite/dist_suite.py, gloo, 2 ranks) whose name is a collective, p2p,
DDP, barrier or group test, CUDA/NCCL-only ones left out. In chunks, so that the machine's
load drifts alike for all three runs of a chunk: bare (outcome, time), under `distdoctor
run` (outcome, time, the ops recorded per rank in the test's incarnation), the two taking
turns going first, then bare once more with the ranks counting their ops at torch's
dispatcher (what the test issued). Each test has torch's own limit of 60 s
(DISTRIBUTED_TESTS_DEFAULT_TIMEOUT, harness.py): one that hangs fails alone. Per test: outcome bare / traced, counts
same or different, times; then the totals, distdoctor's findings (by test) and the time
ratio. The per-test times are pytest's (the test's ranks start, run and exit), so they
leave out pytest's and `distdoctor run`'s own start-up.

    python benchmarks/torch_suite.py [--chunk 10] [--match REGEX] [--limit N]
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "jobs" / "torch_suite"))
from harness import CLASS, SUITE, op_counts, run_suite, traced_runs  # noqa: E402

FAMILIES = (r"all_reduce|broadcast|reduce|gather|scatter|all_to_all|send|recv|barrier|"
            r"ddp|DistributedDataParallel|group|accumulate|object|coalesc|join|average")
LEFT_OUT = r"cuda|nccl|gpu"  # cannot run on gloo/CPU: skipped, after spawning ranks for some


def list_tests(match: str) -> list[str]:
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                          "-p", "no:cacheprovider", "-o", "addopts=", str(SUITE)],
                         capture_output=True, text=True, timeout=300,
                         stdin=subprocess.DEVNULL).stdout
    names = [line.split("::")[-1] for line in out.splitlines() if f"::{CLASS}::" in line]
    return [n for n in names if re.search(match, n) and not re.search(LEFT_OUT, n)]


@dataclass
class Row:
    test: str
    bare: str  # outcome: pass | skip | fail | missing
    traced: str
    bare_s: float
    traced_s: float
    counts: str  # same | n/a (no rank started) | what differs
    message: str  # the traced run's, when the outcomes differ


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--chunk", type=int, default=10)
    ap.add_argument("--match", default=FAMILIES)
    ap.add_argument("--limit", type=int, default=0)
    args = ap.parse_args()

    tests = list_tests(args.match)[:args.limit or None]
    print(f"{len(tests)} tests of torch's _DistTestBase on gloo, 2 ranks, chunks of "
          f"{args.chunk}", flush=True)
    rows: list[Row] = []
    stray_all, found, walls = [], [], {"bare": 0.0, "traced": 0.0}
    work = Path(tempfile.mkdtemp(prefix="dd-torch-suite-"))
    for c in range(0, len(tests), args.chunk):
        chunk, limit, run_dir = tests[c:c + args.chunk], args.chunk * 120, work / f"run{c}"
        try:
            # bare and traced take turns going first: the machine's load drifts
            if c // args.chunk % 2:
                traced = run_suite(chunk, work / f"traced{c}", run_dir=run_dir, timeout=limit)
                bare = run_suite(chunk, work / f"bare{c}", timeout=limit)
            else:
                bare = run_suite(chunk, work / f"bare{c}", timeout=limit)
                traced = run_suite(chunk, work / f"traced{c}", run_dir=run_dir, timeout=limit)
            counted = run_suite(chunk, work / f"counted{c}", count=True, timeout=limit)
        except TimeoutError as exc:  # the chunk's processes are gone: go on with the next
            print(f"  chunk {chunk[0]}..{chunk[-1]}: {exc}", flush=True)
            continue
        walls["bare"] += bare.wall_s
        walls["traced"] += traced.wall_s
        by_test, stray = traced_runs(run_dir, traced.records)
        stray_all += stray
        test_of = {run.incarnation: t for t, incs in by_test.items() for run in incs}
        for f in json.loads((run_dir / "findings.json").read_text())["findings"]:
            inc = f.get("details", {}).get("incarnation", 0)  # unnumbered: the only one
            found.append((test_of.get(inc, f"incarnation {inc}"), f["kind"], f["summary"]))
        for t in chunk:
            issued, recorded = counted.counts.get(t, {}), op_counts(by_test.get(t, []))
            if not issued and not recorded:
                counts = "n/a"  # skipped before any rank started
            elif issued == recorded:
                counts = "same"
            else:
                counts = f"DIFFERENT: issued {issued}, recorded {recorded}"
            if counted.outcomes[t] != bare.outcomes[t]:  # the counter changed the test
                counts += f" (the counting run: {counted.outcomes[t]})"
            row = Row(t, bare.outcomes[t], traced.outcomes[t], bare.times.get(t, 0.0),
                      traced.times.get(t, 0.0), counts,
                      traced.messages.get(t, "") if bare.outcomes[t] != traced.outcomes[t]
                      else "")
            rows.append(row)
            print(f"  {t:60s} {row.bare:5s} {row.traced:5s} {row.bare_s:6.1f}s "
                  f"{row.traced_s:6.1f}s  {'OUTCOME DIFFERS ' if row.message else ''}"
                  f"{counts[:300]}", flush=True)
        if traced.returncode != bare.returncode:
            print(f"  exit code bare {bare.returncode}, under distdoctor run "
                  f"{traced.returncode}: {traced.stderr[-500:]}")
        for proc in traced.left_behind:
            print(f"  left behind by the traced run (killed): {proc}")

    outcomes = collections.Counter(r.bare for r in rows)
    print(f"\n{len(rows)} tests compared (bare: "
          f"{', '.join(f'{n} {o}' for o, n in sorted(outcomes.items()))})")
    print(f"same outcome bare and traced: {sum(r.bare == r.traced for r in rows)}/{len(rows)}")
    for r in rows:
        if r.bare != r.traced:
            print(f"  DIFFERS {r.test}: bare {r.bare}, traced {r.traced}: {r.message[:400]}")
    counted_rows = [r for r in rows if r.counts != "n/a"]
    print(f"op counts per rank, recorded = issued: "
          f"{sum(r.counts == 'same' for r in counted_rows)}/{len(counted_rows)} tests that "
          f"started ranks")
    for r in counted_rows:
        if r.counts != "same":
            print(f"  {r.test}: {r.counts}")
    print(f"findings of distdoctor: {len(found)}, in {len({t for t, _, _ in found})} tests")
    for test, kind, summary in found:
        print(f"  {test}: {kind}: {' '.join(summary.split())[:300]}")
    if stray_all:
        print(f"incarnations no test claimed: {stray_all}")
    ran = [r for r in rows if r.bare_s > 0.5 and r.traced_s > 0.5]  # ranks started
    if ran:
        bare_s, traced_s = sum(r.bare_s for r in ran), sum(r.traced_s for r in ran)
        ratios = [r.traced_s / r.bare_s for r in ran]
        print(f"time of the {len(ran)} tests that started ranks: bare {bare_s:.0f} s, "
              f"traced {traced_s:.0f} s, ratio {traced_s / bare_s:.2f} (per test median "
              f"{statistics.median(ratios):.2f}, {min(ratios):.2f}-{max(ratios):.2f})")
    print(f"whole runs, pytest's and distdoctor's start-up included: bare {walls['bare']:.0f} s, "
          f"traced {walls['traced']:.0f} s, ratio {walls['traced'] / max(walls['bare'], 1):.2f}")
    print(f"work dir (run dirs, junit): {work}")


if __name__ == "__main__":
    main()
