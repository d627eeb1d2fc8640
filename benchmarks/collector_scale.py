"""The collector at scale, with its bounds on (collect/limits.py): a real collector
(`distdoctor watch --listen`, service mode) fed by simulated nodes over loopback.

1. `--ranks 100000`: RANKS ranks by digest from NODES simulated nodes (default 1,000 nodes
   x 100 ranks: the collector serves at most 1,024 nodes), a digest per node every
   INTERVAL s, each rank 100 collectives a second (TP groups of 8 within a node, DP
   groups of one rank per node). The digests' JSON is made here from a template (the
   nodes' own work is theirs). Measured: the collector's CPU (cores), its peak RSS, and
   its descriptors against the goal "nodes + 32".
2. `--old PATH`: the 4,096-rank benchmark of fleet_collector.py (64 nodes x 64 ranks),
   the collector of a checkout at PATH (e.g. `git worktree add /tmp/old <commit>`)
   against this one, in alternating turns within one run: the collector's CPU of each,
   the difference in cores and the ratio of medians.

    python benchmarks/collector_scale.py [--nodes 1000] [--ranks 100000] [--seconds 30]
                                         [--old /tmp/old --turns 2 --turn-seconds 20]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from fleet_collector import DP_OPS, TP_OPS, CollectorProcess, Node

from distdoctor.collect import wire
from distdoctor.launch.env import free_port

SITE = ["/job/train.py", 120, "train_step"]
PER_S = TP_OPS + DP_OPS


def _row(index: int, group: str, seq: int, t_ns: int) -> str:
    return (f'[{index},"collective","all_reduce","ok","{group}",{seq},null,[[4096]],'
            f'["bfloat16"],4096,4096,"sum",{json.dumps(SITE)},{t_ns},{t_ns + 1_000_000},null]')


class DigestNode:
    """A node of `per_node` ranks whose digests are made from a template: each rank's
    position and the runs of collectives its ranks entered since the last one."""

    def __init__(self, node: int, per_node: int, nodes: int):
        self.node, self.per_node, self.nodes = node, per_node, nodes
        self.host = f"sim{node:05d}"
        self.ranks = [node * per_node + i for i in range(per_node)]
        self.done = 0

    def connect(self, port: int) -> DigestNode:
        import socket

        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.sendall(wire.json_frame(wire.HELLO, {
            "format": wire.FORMAT, "version": wire.VERSION, "host": self.host,
            "instance": self.host, "run": {}}))
        answer = wire.read_frame(self.sock.makefile("rb").read)
        assert answer is not None and answer[0] == wire.WELCOME, answer
        return self

    def groups(self) -> dict:
        """Its TP groups; the DP groups (one member per node) from node 0 only: a node
        sends every group its ranks are in, but a thousand copies of the same thousand
        -member lists on connecting is the simulator's cost, not the steady state's."""
        out = {}
        for r in self.ranks:
            base = r - r % 8
            out[f"tp{r // 8}"] = ["tp", list(range(base, base + 8))]
            if self.node == 0:
                out[f"dp{r % self.per_node}"] = ["dp", [n * self.per_node + r % self.per_node
                                                        for n in range(self.nodes)]]
        return out

    def digest(self, done: int, now_ns: int, first: bool) -> bytes:
        """The DIGEST frame once each rank finished `done` collectives."""
        tp, dp = done * TP_OPS // PER_S, done * DP_OPS // PER_S
        ptp, pdp = self.done * TP_OPS // PER_S, self.done * DP_OPS // PER_S
        self.done = done
        rows, runs = [], []
        for r in self.ranks:
            row = _row(done, f"tp{r // 8}", tp, now_ns - 2_000_000)
            rows.append(f'[{r},{row},{row},{{"tp{r // 8}":{tp},"dp{r % self.per_node}":{dp}}},'
                        f'{now_ns},null,false,{{"steps":{done // PER_S}}}]')
            if dp > pdp:
                runs.append(f'["dp{r % self.per_node}",{pdp},0,[{r}],{dp - pdp}]')
        if tp > ptp:  # a TP group of 8 may straddle two nodes: each sends its members
            low, high = self.ranks[0], self.ranks[-1]
            for g in range(low // 8, high // 8 + 1):
                members = ",".join(str(m) for m in range(max(g * 8, low),
                                                         min(g * 8 + 8, high + 1)))
                runs.append(f'["tp{g}",{ptp},0,[{members}],{tp - ptp}]')
        groups = json.dumps(self.groups(), separators=(",", ":")) if first else "{}"
        sigs = ('{"0":' + _row(0, "dp0", 0, 0) + "}") if first else "{}"
        text = (f'{{"host":"{self.host}","ranks":[{",".join(rows)}],"groups":{groups},'
                f'"sigs":{sigs},"arrivals":[{",".join(runs)}],"waits":[],"dropped":0}}')
        return wire.frame(wire.DIGEST, text.encode())


def fds_of(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def scale(args) -> None:
    per_node = args.ranks // args.nodes
    port = free_port()
    copy = tempfile.mkdtemp(prefix="dd-scale-")
    collector = CollectorProcess(port, copy, "auto")
    try:
        assert collector.wait_for("collecting on", 30), "the collector did not start"
        nodes = [DigestNode(n, per_node, args.nodes).connect(port) for n in range(args.nodes)]
        t0 = time.monotonic()
        sent, rounds, build_s, max_fds, cpu0 = 0, 0, 0.0, 0, None
        while time.monotonic() - t0 < args.seconds:
            tick = time.monotonic()
            done = int((tick - t0) * PER_S) + PER_S
            for node in nodes:
                b0 = time.monotonic()
                data = node.digest(done, time.monotonic_ns(), rounds == 0)
                build_s += time.monotonic() - b0
                node.sock.sendall(data)
                sent += len(data)
            rounds += 1
            if rounds == 2:  # the groups and the first positions taken in: steady state
                cpu0, t1 = collector.cpu_s(), time.monotonic()
            collector.sample_rss()
            max_fds = max(max_fds, fds_of(collector.proc.pid))
            time.sleep(max(0.0, args.interval - (time.monotonic() - tick)))
        wall = time.monotonic() - t1
        cores = (collector.cpu_s() - cpu0) / wall
        print(f"{args.nodes:,} nodes x {per_node:,} ranks = {args.nodes * per_node:,} ranks by "
              f"digest, {PER_S} collectives/s a rank, a digest per node every "
              f"{args.interval:g} s: {sent / (time.monotonic() - t0) / 1e6:.1f} MB/s "
              f"(the simulator spent {build_s / (time.monotonic() - t0):.2f} of a core "
              f"making them)")
        per_round = (collector.cpu_s() - cpu0) / max(1, rounds - 2)
        print(f"  {rounds / (time.monotonic() - t0):.2f} rounds of every node's digest a "
              f"second (asked: {1 / args.interval:g}); the collector's CPU per round "
              f"{per_round:.2f} s: {per_round * 2:.2f} cores at a digest every 0.5 s")
        print(f"  collector: {cores:.2f} cores (steady, over {wall:.0f} s), peak RSS "
              f"{collector.peak_rss / 2**20:,.0f} MiB, descriptors at most {max_fds} "
              f"(goal: under nodes + 32 = {args.nodes + 32})")
        lines = [line for _, line in collector.lines if "dropped" in line or "refused" in line]
        print(f"  nodes dropped or refused: {len(lines)}" + (f" ({lines[0].strip()})"
                                                           if lines else ""))
        for node in nodes:
            node.sock.close()
    finally:
        collector.stop()


def _old_env(old: str) -> dict:
    """PYTHONPATH that makes `python -m distdoctor` the checkout at `old`, past this
    venv's editable install (its finder is dropped by a sitecustomize of our own)."""
    shim = Path(tempfile.mkdtemp(prefix="dd-old-"))
    (shim / "sitecustomize.py").write_text(
        "import sys\nsys.meta_path[:] = [f for f in sys.meta_path "
        "if 'editable' not in repr(f)]\n")
    for sub in ("probes", "tui"):  # installed as distdoctor.probes, distdoctor.tui
        link = Path(old) / "distdoctor" / sub
        if not link.exists():
            link.symlink_to(Path("..") / sub)
    return {"PYTHONPATH": f"{shim}:{old}"}


def turn(old_env: dict | None, seconds: float) -> float:
    """The collector's cores over one turn of the 4,096-rank fleet (fleet_collector.py)."""
    port = free_port()
    collector = CollectorProcess(port, tempfile.mkdtemp(prefix="dd-turn-"), "auto", old_env)
    try:
        assert collector.wait_for("collecting on", 30), "the collector did not start"
        nodes = [Node(n, 64, 64).connect(port) for n in range(64)]
        time.sleep(1.0)
        t0, t0_ns, cpu0 = time.monotonic(), time.monotonic_ns(), collector.cpu_s()
        while time.monotonic() - t0 < seconds:
            tick = time.monotonic()
            done = int((tick - t0) * PER_S) + PER_S
            for node in nodes:
                node.sock.sendall(node.digest(done, node.prev, time.monotonic_ns(), t0_ns, {}))
                node.prev = done
            time.sleep(max(0.0, 0.5 - (time.monotonic() - tick)))
        return (collector.cpu_s() - cpu0) / (time.monotonic() - t0)
    finally:
        collector.stop()


def compare(args) -> None:
    old_env = _old_env(args.old)
    got: dict[str, list[float]] = {"old": [], "new": []}
    for t in range(args.turns):
        for side in (("old", "new") if t % 2 == 0 else ("new", "old")):
            got[side].append(turn(old_env if side == "old" else None, args.turn_seconds))
    diffs = [n - o for n, o in zip(got["new"], got["old"], strict=True)]
    print(f"4,096 ranks by digest (64 nodes x 64), {args.turns} turns of "
          f"{args.turn_seconds:g} s each side: collector {statistics.median(got['new']):.3f} "
          f"cores (this checkout) against {statistics.median(got['old']):.3f} ({args.old}): "
          f"{statistics.median(diffs):+.3f} of a core (median within a turn; "
          f"{min(diffs):+.3f} to {max(diffs):+.3f}), "
          f"{statistics.median(got['new']) / statistics.median(got['old']):.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--ranks", type=int, default=100_000)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--interval", type=float, default=0.5)
    ap.add_argument("--old", help="a checkout of the collector to compare at 4,096 ranks")
    ap.add_argument("--turns", type=int, default=2)
    ap.add_argument("--turn-seconds", type=float, default=20.0)
    args = ap.parse_args()
    if args.old:
        compare(args)
    if args.ranks:
        scale(args)


if __name__ == "__main__":
    sys.exit(main())
