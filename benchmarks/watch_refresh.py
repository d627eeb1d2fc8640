"""What one redraw of `distdoctor watch` costs on a large job (synthetic, one core).

A 256-rank run dir (ring files written as the tracer writes them) is followed by the
viewer; then, repeated: take a snapshot (under the live engine's lock) and draw it into the
headless dashboard (every cell of the 256-row ranks table updated). Prints milliseconds
per refresh and the share of one core the dashboard takes at its 0.5 s refresh.

  python benchmarks/watch_refresh.py [--ranks 256] [--collectives 200] [--refreshes 20]
  python benchmarks/watch_refresh.py --fleet 64    # the collector's view of 4,096 ranks
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from dataclasses import replace

from diagnosis_ingest import RingJob, synthetic
from distdoctor.tui.app import REFRESH_S, WatchApp

from distdoctor.diagnosis.live import LiveDiagnosis
from distdoctor.runlog.rundir import write_run_meta
from distdoctor.views.snapshot import SnapshotTaker


def _moved_on(snap):
    """The same job a moment later, every rank somewhere else: six cells of each of its
    rows change (where, last done, rate, span, lateness; the state stays)."""
    ranks = [replace(r, where=f"all_gather #{r.collectives} in group 0 for 0.3 s",
                     last_done=f"all_reduce #{r.collectives} (0)", rate=(r.rate or 0) + 1,
                     span=f"step {r.collectives}", lateness_ms=(r.lateness_ms or 0) + 0.5)
             for r in snap.ranks]
    return replace(snap, ranks=ranks)


def measure(ranks: int, collectives: int, refreshes: int,
            moving: bool) -> tuple[float, float]:
    """(ms per snapshot, ms per draw), CPU time of this process. `moving`: every other
    refresh shows every rank moved on, so each draw updates every row."""
    with tempfile.TemporaryDirectory() as run_dir:
        write_run_meta(run_dir, world_size=ranks, command=["python", "train.py"])
        RingJob(run_dir, ranks, collectives)(synthetic(ranks, collectives, in_flight=False))
        live = LiveDiagnosis(run_dir, 60.0, stacks="none", owner=False)
        live.pass_once()
        taker = SnapshotTaker(live)
        app = WatchApp(taker, refresh_s=3600)  # the app's own timer stays out of the way
        take_s = draw_s = 0.0

        async def drive():
            nonlocal take_s, draw_s
            async with app.run_test(size=(200, 60)) as pilot:
                await pilot.pause(0.5)  # the first draw adds the rows; updates are timed
                for n in range(refreshes):
                    t0 = time.process_time()
                    snap = taker.take()
                    t1 = time.process_time()
                    if moving and n % 2:
                        snap = _moved_on(snap)
                    app.show(snap)
                    await pilot.pause()  # let Textual lay the table out and paint it
                    t2 = time.process_time()
                    take_s += t1 - t0
                    draw_s += t2 - t1
                assert app.query_one("#ranks").row_count == ranks

        asyncio.run(drive())
        live.close()
    return take_s / refreshes * 1e3, draw_s / refreshes * 1e3


def measure_fleet(nodes: int, per_node: int, refreshes: int,
                  show_all: bool) -> tuple[float, float, int]:
    """The collector's dashboard over `nodes` x `per_node` ranks whose nodes send digests
    (benchmarks/fleet_collector.py's simulated job, 3 s in, one rank stopped so its
    peers hang): (ms per snapshot, ms per draw, rows in the table). The digests move the
    job on by half a second between refreshes (applying them is not timed: the
    collector's node threads do it)."""
    from fleet_collector import DP_OPS, TP_OPS, Node, blocked_after

    from distdoctor.collect.fleet import FleetEngine

    per_s = TP_OPS + DP_OPS
    fleet = FleetEngine(hang_timeout_s=1.0)
    sim = [Node(n, per_node, nodes) for n in range(nodes)]
    stuck = per_node + 5
    faults = {"hang": (stuck, 2 * per_s + 7)}
    faults["blocked"] = blocked_after(stuck, faults["hang"][1], sim, per_s)
    t0_ns = time.monotonic_ns() - 3_000_000_000
    done = [3 * per_s]

    def advance():
        prev, done[0] = done[0], done[0] + per_s // 2
        for node in sim:
            fleet.apply(node.payload(done[0], prev, time.monotonic_ns(), t0_ns, faults))

    advance()
    fleet.tick()
    with tempfile.TemporaryDirectory() as run_dir:
        write_run_meta(run_dir, world_size=nodes * per_node, command=["distdoctor", "watch"])
        live = LiveDiagnosis(run_dir, 1.0, stacks="none", owner=False)
        live.pass_once()
        taker = SnapshotTaker(live, fleet=fleet)
        app = WatchApp(taker, refresh_s=3600)
        take_s = draw_s = 0.0
        rows = 0

        async def drive():
            nonlocal take_s, draw_s, rows
            async with app.run_test(size=(200, 60)) as pilot:
                if show_all:
                    await pilot.press("a")
                app.show(taker.take())
                await pilot.pause(0.5)
                for _ in range(refreshes):
                    advance()
                    t0 = time.process_time()
                    snap = taker.take()
                    t1 = time.process_time()
                    app.show(snap)
                    await pilot.pause()
                    t2 = time.process_time()
                    take_s += t1 - t0
                    draw_s += t2 - t1
                rows = app.query_one("#ranks").row_count
                assert len(snap.ranks) == nodes * per_node, len(snap.ranks)

        asyncio.run(drive())
        live.close()
    return take_s / refreshes * 1e3, draw_s / refreshes * 1e3, rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=256)
    ap.add_argument("--collectives", type=int, default=200)
    ap.add_argument("--refreshes", type=int, default=20)
    ap.add_argument("--fleet", type=int, metavar="NODES", default=0,
                    help="the collector's view of NODES x 64 ranks sending digests")
    args = ap.parse_args()
    if args.fleet:
        for show_all, how in ((False, "the summary and the notable ranks"),
                              (True, "every rank in the table ('a')")):
            take_ms, draw_ms, rows = measure_fleet(args.fleet, 64, args.refreshes, show_all)
            print(f"{args.fleet * 64} ranks from digests, {how}: {rows} rows, snapshot "
                  f"{take_ms:.1f} ms + draw {draw_ms:.1f} ms per refresh = "
                  f"{1e3 / (take_ms + draw_ms):.1f} refreshes a second at most")
        return
    for moving, how in ((False, "nothing changed"), (True, "every rank moved on")):
        take_ms, draw_ms = measure(args.ranks, args.collectives, args.refreshes, moving)
        share = (take_ms + draw_ms) / 1e3 / REFRESH_S
        print(f"{args.ranks} ranks, {how}: snapshot {take_ms:.1f} ms + draw {draw_ms:.1f} ms "
              f"per refresh = {share:.2f} of one core at one refresh per {REFRESH_S:g} s")


if __name__ == "__main__":
    main()
