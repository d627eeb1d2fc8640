"""What forwarding a node to the collector costs (`distdoctor run --forward`).

One node of RANKS ranks, each recording RATE collectives a second into its ring (written
as the tracer writes them), forwarded over loopback TCP to a collector in this process.
Prints the forwarder's CPU time as a share of one core, the bytes sent per event, and
how long an event takes to show in the collector's copy (from the rank's write to the
copy's header counting it), median and 99th percentile.

    python benchmarks/forward_cost.py [--ranks 8] [--rate 2000] [--seconds 10]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path

from diagnosis_ingest import RingJob, synthetic

from distdoctor.collect import forward
from distdoctor.collect.forward import Forwarder
from distdoctor.collect.server import Collector, listen
from distdoctor.runlog import format as F
from distdoctor.runlog.reader import RankLog
from distdoctor.runlog.rundir import ring_path


def measure(ranks: int, rate: int, seconds: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        node, copy = Path(tmp) / "node", Path(tmp) / "copy"
        node.mkdir()
        total = int(rate * seconds) + rate
        job = RingJob(node, ranks, total)
        events = synthetic(ranks, total, in_flight=False)  # rank-interleaved, seq by seq
        collector = Collector(copy, listen(("127.0.0.1", 0)), None, say=lambda line: None).start()
        fwd = Forwarder(node, collector.address)
        written: list[tuple[int, float]] = []  # (events per rank written, when)
        stop = threading.Event()
        cpu = [0.0]

        def forwarding():
            while not stop.wait(forward.INTERVAL_S):
                t0 = time.thread_time()
                fwd.tick()
                cpu[0] += time.thread_time() - t0

        def writing():
            start, n, step = time.monotonic(), 0, ranks * max(1, rate // 100)
            while n < len(events) - step and time.monotonic() - start < seconds:
                job(events[n:n + step])  # every 10 ms, 1/100 s of every rank's ops
                n += step
                written.append((n // ranks, time.monotonic()))
                time.sleep(max(0.0, start + len(written) / 100 - time.monotonic()))

        threads = [threading.Thread(target=forwarding), threading.Thread(target=writing)]
        for t in threads:
            t.start()
        lags, seen = [], 0
        wall0 = time.monotonic()
        while threads[1].is_alive() or seen < len(written):
            try:
                head = RankLog(ring_path(copy, ranks - 1)).header().head
            except Exception:
                head = 0
            now = time.monotonic()
            while seen < len(written) and written[seen][0] <= head:
                lags.append(now - written[seen][1])
                seen += 1
            if now - wall0 > seconds + 5:
                break
            time.sleep(0.002)
        wall = time.monotonic() - wall0
        stop.set()
        for t in threads:
            t.join()
        collector.stop()
        lags.sort()
        return {"cpu_share": cpu[0] / wall, "bytes_per_event": fwd.sent_bytes / max(
                    1, written[-1][0] * ranks), "lag_median_ms": statistics.median(lags) * 1e3,
                "lag_p99_ms": lags[int(len(lags) * 0.99)] * 1e3, "events": written[-1][0] * ranks}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--rate", type=int, default=2000, help="collectives per second per rank")
    ap.add_argument("--seconds", type=float, default=10.0)
    a = ap.parse_args()
    r = measure(a.ranks, a.rate, a.seconds)
    print(f"{a.ranks} ranks x {a.rate} collectives/s for {a.seconds:.0f} s "
          f"({r['events']:,} events): forwarder {r['cpu_share'] * 100:.1f}% of one core, "
          f"{r['bytes_per_event']:.0f} bytes/event; in the copy after "
          f"{r['lag_median_ms']:.0f} ms (median), {r['lag_p99_ms']:.0f} ms (p99); "
          f"slot {F.SLOT_SIZE} B")


if __name__ == "__main__":
    main()
