"""What TLS costs the forwarding of 4,096 ranks by digest: the same simulated fleet as
fleet_collector.py (64 nodes x 64 ranks, 100 collectives a second a rank, a digest per
node twice a second) sent to a real collector (`watch --listen`) over plain TCP and over
TLS with client certificates (made here with the openssl CLI), in turns within one run
(their order alternates, so a machine's drift falls on both).

Measured per turn: the collector's CPU (its process's CPU time over the wall time) and
the senders' CPU in `sendall` (this process's thread time: with TLS, the encryption each
node's `run` would pay, here summed over all 64 nodes). Digest building is left out (the
same JSON either way). The result: the difference TLS minus plain within each turn, in
cores (its median and range), and the ratio of the two sides' medians.

    python benchmarks/tls_cost.py [--nodes 64] [--ranks-per-node 64] [--seconds 15]
                                  [--turns 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from fleet_collector import DP_OPS, TP_OPS, CollectorProcess, Node

from distdoctor.collect.tls import TLSSettings
from distdoctor.launch.env import free_port

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import tlscerts  # noqa: E402  (the tests' certificate maker: a CA, server and client)


def turn(args, certs, use_tls: bool) -> tuple[float, float]:
    """(collector cores, senders' cores) over one turn."""
    env, ctx = {}, None
    if use_tls:
        env = certs.server_env(require_clients=True)
        ctx = TLSSettings(str(certs.client), str(certs.client_key),
                          str(certs.ca)).client_context("benchmark")
    port = free_port()
    collector = CollectorProcess(port, tempfile.mkdtemp(prefix="dd-tls-"), "auto", env)
    try:
        assert collector.wait_for("collecting on", 30), "the collector did not start"
        nodes = [Node(n, args.ranks_per_node, args.nodes).connect(port, ctx)
                 for n in range(args.nodes)]
        per_s = TP_OPS + DP_OPS
        time.sleep(1.0)  # the connections' own start is not the steady cost
        t0, t0_ns, cpu0, send_s = time.monotonic(), time.monotonic_ns(), collector.cpu_s(), 0.0
        while time.monotonic() - t0 < args.seconds:
            tick = time.monotonic()
            done = int((tick - t0) * per_s) + per_s
            for node in nodes:
                data = node.digest(done, node.prev, time.monotonic_ns(), t0_ns, {})
                node.prev = done
                s0 = time.thread_time()
                node.sock.sendall(data)
                send_s += time.thread_time() - s0
            time.sleep(max(0.0, 0.5 - (time.monotonic() - tick)))
        wall = time.monotonic() - t0
        return (collector.cpu_s() - cpu0) / wall, send_s / wall
    finally:
        collector.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--ranks-per-node", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--turns", type=int, default=2)
    args = ap.parse_args()
    certs = tlscerts.make(Path(tempfile.mkdtemp(prefix="dd-tls-certs-")))
    got: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    for i in range(args.turns):  # plain first, then TLS first: drift falls on both
        for use_tls in ((False, True) if i % 2 == 0 else (True, False)):
            got[use_tls].append(turn(args, certs, use_tls))
            c, s = got[use_tls][-1]
            print(f"  {'TLS  ' if use_tls else 'plain'}: collector {c:.3f} cores, "
                  f"senders {s:.3f} cores")
    plain = [c + s for c, s in got[False]]
    tls = [c + s for c, s in got[True]]
    p, t = statistics.median(plain), statistics.median(tls)
    diffs = sorted(b - a for a, b in zip(plain, tls, strict=True))  # within each turn
    world = args.nodes * args.ranks_per_node
    print(f"{world:,} ranks by digest, {args.turns} turns of {args.seconds:g} s each way: "
          f"forwarding (collector + senders) {p:.3f} cores plain, {t:.3f} with TLS and "
          f"client certificates (medians), ratio {t / p:.2f}x")
    print(f"  TLS minus plain within a turn: median {statistics.median(diffs):+.3f} of a "
          f"core (goal <= 0.10), from {diffs[0]:+.3f} to {diffs[-1]:+.3f}")
    cp = statistics.median(c for c, _ in got[False])
    ct = statistics.median(c for c, _ in got[True])
    sp = statistics.median(s for _, s in got[False])
    st = statistics.median(s for _, s in got[True])
    print(f"  collector alone: {cp:.3f} -> {ct:.3f} cores; the 64 senders' sendall: "
          f"{sp:.3f} -> {st:.3f}")

if __name__ == "__main__":
    main()
