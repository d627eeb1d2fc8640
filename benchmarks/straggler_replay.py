"""Judge recorded runs again, as `distdoctor run` judged them live: each run dir's events
fed through the engine in the order of the job's time, with a straggler verdict every
second (the probe samples seen by then included), the latest verdict per slow rank kept.
Run it under two checkouts to compare two rule sets on the same runs.

    python benchmarks/straggler_replay.py RUN_DIR... [--verbose]

(`benchmarks/framework_healthy.py` keeps its run dirs: /tmp/framework-healthy-*/run.)
Prints each run's straggler and host findings; the count of runs with a straggler.
"""

from __future__ import annotations

import argparse

from distdoctor.probes.sampler import read_samples

from distdoctor.diagnosis.engine.core import Engine
from distdoctor.runlog.run import read_run


def replay(path: str) -> list:
    run, samples = read_run(path), read_samples(path)
    events = []
    for rank, evs in run.events.items():  # each rank's own order, then the job's time
        events += sorted(evs + run.stack_samples.get(rank, []), key=lambda e: e.index)
    events.sort(key=lambda e: e.t_enter_ns)
    if not events:
        return []
    t0, t1 = events[0].t_enter_ns, events[-1].t_enter_ns
    s0, s1 = (samples[0].t, samples[-1].t) if samples else (0.0, 0.0)
    engine, found, next_ns = Engine(None, postmortem=True), {}, t0 + 1e9
    for i, ev in enumerate(events):
        engine.ingest_one(ev, 0.0)
        if ev.t_enter_ns >= next_ns or i == len(events) - 1:
            next_ns = ev.t_enter_ns + 1e9
            # the samples (wall clock) up to the same share of the run (monotonic clock)
            upto = s0 + (ev.t_enter_ns - t0) / max(1, t1 - t0) * (s1 - s0) + 1
            for f in engine.straggler.findings([s for s in samples if s.t <= upto]):
                # as the live engine keys them: one finding per slow rank, the latest
                ranks = tuple(f.ranks or f.details.get("slowed_ranks") or ())
                found[ranks or f.summary] = f
    return list(found.values())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("run_dirs", nargs="+")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args()
    bad = 0
    for path in args.run_dirs:
        findings = replay(path)
        stragglers = [f for f in findings if f.kind == "straggler"]
        bad += bool(stragglers)
        print(f"{'STRAGGLER' if stragglers else 'ok':9} {path} "
              f"{[(f.kind, f.ranks or f.details.get('slowed_ranks')) for f in findings]}")
        for f in stragglers if args.verbose else ():
            print("   ", f.summary)
    print(f"{bad}/{len(args.run_dirs)} runs with a straggler")


if __name__ == "__main__":
    main()
