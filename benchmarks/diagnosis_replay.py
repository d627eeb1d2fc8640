"""The live diagnosis' CPU per event, replayed from a recorded run dir on one core.

    python benchmarks/diagnosis_replay.py [RUN_DIR] [--ranks 2] [--rate 1000] [--seconds 30]
                                          [--poll-s 0.25] [--turns 3]

What `run_budget.py` measures live (`run`'s whole process, in 10 ms clock ticks, on a
machine whose neighbours move it by a few tenths of a percent) taken apart, on the same
events every turn: (1) reading the rank logs, with the C slot decoder and with the
Python one (runlog/_decode.c, reader.py); (2) the engine's ingest of every event, fed in
the order the ranks finished them, in polls of `--poll-s` of the job's own time with a
tick after each, as the live loop does, with the C ingest (diagnosis/engine/_ingest.c)
and with the Python one. CPU time (time.process_time), best of `--turns`.

Without RUN_DIR, one is recorded first: `distdoctor run --nproc RANKS` of run_budget.py's
ranks (torch's fake backend, RATE all-reduces a second each, in bursts of 10) for
SECONDS. The report gives each part in us an event and what they come to, at the
recorded rate, as a share of one core (issue 49's goal: 1% at 2 ranks x 1,000/s).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

from distdoctor.diagnosis.engine import core
from distdoctor.diagnosis.engine.core import Engine
from distdoctor.diagnosis.live import relax_gc
from distdoctor.runlog import reader
from distdoctor.runlog.follow import RunFollower


def record(run_dir: str, ranks: int, rate: int, seconds: float) -> None:
    budget = os.path.join(os.path.dirname(os.path.abspath(__file__)), "run_budget.py")
    done = subprocess.run(
        [sys.executable, "-m", "distdoctor", "run", "--nproc", str(ranks), "--run-dir",
         run_dir, "--", sys.executable, budget, "--rank", str(rate), str(seconds)],
        capture_output=True, text=True, timeout=seconds + 180,
        cwd=os.path.dirname(run_dir))
    if done.returncode:
        raise SystemExit(f"recording failed (exit {done.returncode}):\n{done.stdout[-2000:]}")


def read_all(run_dir: str, decoder) -> tuple[list, float]:
    """Every event of the run dir through one decoder, and the CPU seconds it took."""
    saved, reader._native = reader._native, decoder
    try:
        follower = RunFollower(run_dir)
        start = time.process_time()
        events = follower.poll(final=True)
        cpu = time.process_time() - start
        follower.close()
    finally:
        reader._native = saved
    return events, cpu


def replay(events: list, poll_s: float, native=core._NATIVE) -> tuple[float, float, int, list]:
    """(ingest CPU, tick CPU, ticks, findings) of the events fed in polls of the job's
    time, through the C ingest (`native`) or, with None, the Python one."""
    saved, core._NATIVE = core._NATIVE, native
    try:
        return _replay(events, poll_s)
    finally:
        core._NATIVE = saved


def _replay(events: list, poll_s: float) -> tuple[float, float, int, list]:
    events = sorted(events, key=lambda e: e.t_end_ns or e.t_enter_ns)
    engine, found = Engine(hang_timeout_s=None), []
    step = int(poll_s * 1e9)
    edge = (events[0].t_end_ns or events[0].t_enter_ns) + step
    ingest = tick = 0.0
    ticks = start = 0
    while start < len(events):
        stop = start
        while stop < len(events) and (events[stop].t_end_ns or events[stop].t_enter_ns) < edge:
            stop += 1
        a = time.process_time()
        engine.ingest(events[start:stop], edge / 1e9)
        b = time.process_time()
        found += engine.tick(edge / 1e9)
        tick += time.process_time() - b
        ingest += b - a
        ticks += 1
        start, edge = stop, edge + step
    return ingest, tick, ticks, found


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", nargs="?", help="a recorded run dir (default: record one)")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--rate", type=int, default=1000, help="collectives per second per rank")
    ap.add_argument("--seconds", type=float, default=30.0, help="the recording's length")
    ap.add_argument("--poll-s", type=float, default=0.25, help="the live loop's poll")
    ap.add_argument("--turns", type=int, default=3)
    args = ap.parse_args()
    relax_gc()  # as the live loop runs (distdoctor run's own process)
    with tempfile.TemporaryDirectory(prefix="bench-replay-") as tmp:
        run_dir = args.run_dir
        if run_dir is None:
            run_dir = os.path.join(tmp, "run")
            print(f"recording {args.ranks} ranks x {args.rate}/s for {args.seconds:g} s ...",
                  flush=True)
            record(run_dir, args.ranks, args.rate, args.seconds)
        best = {"read, C decoder": float("inf"), "read, Python decoder": float("inf"),
                "ingest": float("inf"), "ingest, Python": float("inf"), "ticks": float("inf")}
        for _ in range(args.turns):
            events, cpu = read_all(run_dir, reader.native_decoder())
            best["read, C decoder"] = min(best["read, C decoder"], cpu)
            best["read, Python decoder"] = min(best["read, Python decoder"],
                                               read_all(run_dir, None)[1])
            ingest, tick, ticks, found = replay(events, args.poll_s)
            best["ingest"], best["ticks"] = min(best["ingest"], ingest), min(best["ticks"], tick)
            best["ingest, Python"] = min(best["ingest, Python"],
                                         replay(events, args.poll_s, None)[0])
    if reader.native_decoder() is None:
        del best["read, C decoder"]  # (not built: both reads are the Python decoder's)
    if core._NATIVE is None:
        del best["ingest, Python"]  # (likewise: "ingest" is the Python one)
    clock = [e.t_end_ns or e.t_enter_ns for e in events]
    span_s = (max(clock) - min(clock)) / 1e9
    rate = len(events) / span_s if span_s > 0 else 0.0
    print(f"{len(events)} events over {span_s:.1f} s of the job ({rate:.0f} a second), "
          f"{ticks} polls of {args.poll_s:g} s; findings: "
          f"{', '.join(f.kind for f in found) or 'none'}")
    for part, cpu in best.items():
        print(f"  {part:22s} {cpu / len(events) * 1e6:6.2f} us an event"
              f"  ({cpu / span_s * 100:.2f}% of a core at the recorded rate)")
    live = ("read, C decoder" if "read, C decoder" in best else "read, Python decoder",
            "ingest", "ticks")
    total = sum(best[p] for p in live)
    print(f"  read + ingest + ticks  {total / len(events) * 1e6:6.2f} us an event"
          f"  ({total / span_s * 100:.2f}% of a core)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
