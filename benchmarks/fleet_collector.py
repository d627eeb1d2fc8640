"""One collector for 4,096 ranks: 64 simulated nodes x 64 ranks send digests (the frames
`run --forward-digest` sends: collect/digest.py) over loopback TCP to a real collector
(`distdoctor watch --listen`, service mode); a straggler, a cross-node mismatch and a
hang are injected. Measured: the collector's CPU (cores, from its process's CPU time) and peak
RSS, and how long after each fault its finding is printed.

The simulated job (documented rate): each rank issues 100 collectives a second, in 1 s
steps of 80 all_reduces in its TP group (8 ranks, within a node) and 20 in its DP group
(64 ranks, one per node: the worst case for a digest, which cannot merge them). The nodes'
own work (following their ranks' logs, building digests) is theirs, on their own machines:
here the simulator builds the digests' JSON itself, in this process, not in the collector.

Reports that come late or sparse (a busy node, a congested management network) must not
make hangs: --late-node N delays node N's digests by --late-s seconds, --thin K sends
every node's digests K times sparser (as a loaded machine did); the hang is still named
once, for the rank that stopped, and no running rank is called hung.

    python benchmarks/fleet_collector.py [--nodes 64] [--ranks-per-node 64]
                                         [--hang-timeout auto|S] [--seconds 40]
                                         [--late-node 62 --late-s 10] [--thin 10]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time

import psutil

from distdoctor.collect import wire
from distdoctor.collect.digest import runs
from distdoctor.launch.env import free_port

TP, TP_OPS, DP_OPS = 8, 80, 20  # per 1 s step
SITE = ["/job/train.py", 120, "train_step"]


class Node:
    def __init__(self, node: int, per_node: int, nodes: int):
        self.node, self.per_node, self.nodes = node, per_node, nodes
        self.ranks = [node * per_node + i for i in range(per_node)]
        self.groups_sent = False
        self.prev = 0  # ops done at its last digest
        self.held: list[tuple[float, bytes]] = []  # digests sent late: (when, frame)

    def connect(self, port: int, tls=None) -> Node:
        """`tls`: a client ssl.SSLContext (benchmarks/tls_cost.py)."""
        per_node = self.per_node
        self.sock = socket.create_connection(("127.0.0.1", port))
        if tls is not None:
            self.sock = tls.wrap_socket(self.sock, server_hostname="127.0.0.1")
        self.sock.sendall(wire.json_frame(wire.HELLO, {
            "format": wire.FORMAT, "version": wire.VERSION, "host": f"node{self.node:03d}",
            "token": None, "run": {}}))
        answer = wire.read_frame(self.sock.makefile("rb").read)
        assert answer is not None and answer[0] == wire.WELCOME, answer
        for r in self.ranks:
            self.sock.sendall(wire.json_frame(wire.META, {
                "rank": r, "local_rank": r % per_node, "host": f"node{self.node:03d}",
                "pid": 100000 + r}, rank=r))
        return self

    def tp(self, r: int) -> str:
        return f"tp{r // TP}"

    def dp(self, r: int) -> str:
        return f"dp{r % self.per_node}"

    def groups(self) -> dict:
        out = {}
        for r in self.ranks:
            base = r - r % TP
            out[self.tp(r)] = ["tp", list(range(base, base + TP))]
            out[self.dp(r)] = ["dp", [n * self.per_node + r % self.per_node
                                      for n in range(self.nodes)]]
        return out

    def digest(self, *args) -> bytes:
        """The DIGEST frame of `payload(*args)`."""
        return wire.frame(wire.DIGEST, json.dumps(self.payload(*args),
                                                  separators=(",", ":")).encode())

    def payload(self, done_ops: int, prev_ops: int, now_ns: int, t0_ns: int,
                faults: dict) -> dict:
        """The digest after each rank got to op `done_ops` (`prev_ops` at the last
        digest); `faults`: "mismatch" (rank, op), and once the hang happened "blocked"
        (rank -> the op it is stuck before: the culprit) or in (the ranks waiting)."""
        per_step = TP_OPS + DP_OPS
        ranks, arrivals, waits = [], {}, []
        blocked, culprit = faults.get("blocked", {}), faults.get("hang", (-1, 0))[0]
        odd_rank, odd_op = faults.get("mismatch", (-1, -1))
        slow, slow_from, slow_ms = faults.get("straggler", (-1, 1 << 62, 0.0))
        for r in self.ranks:
            at = blocked.get(r)
            stop = done_ops if at is None else min(done_ops, at + (r != culprit))
            for i in range(prev_ops, stop):  # entered since the last digest
                group, seq = self._op(r, i, per_step)
                sig = 1 if (r, i) == (odd_rank, odd_op) else 0
                arrivals.setdefault((group, seq, sig), []).append(r)
                if group[0] == "d" and i < stop - (at is not None):  # finished DP ops
                    # each rank's own wait: 0.5-2.5 ms of noise, and the straggler's DP
                    # peers wait for it once it slows down
                    wait = 500_000 + (r * 7919 + i * 104729) % 2_000_000
                    if i >= slow_from and r != slow and self.dp(r) == self.dp(slow):
                        wait += int(slow_ms * 1e6)
                    waits.append([group, seq, 1, wait, r, None])
            if at is not None and done_ops >= at:
                last = _row(at - 1, *self._op(r, at - 1, per_step), t0_ns, True)
                if r == culprit:  # outside any collective
                    latest, issued = last, self._issued(r, at, per_step)
                else:  # waiting in op `at` since it got there
                    latest = _row(at, *self._op(r, at, per_step),
                                  t0_ns + int(at / per_step * 1e9), False)
                    issued = self._issued(r, at + 1, per_step)
            else:
                latest = last = _row(done_ops - 1, *self._op(r, done_ops - 1, per_step),
                                     now_ns - 2_000_000, True)
                issued = self._issued(r, done_ops, per_step)
            stopped_s = None
            if r == culprit and at is not None and done_ops >= at:
                stopped_s = max(0.0, (now_ns - t0_ns) / 1e9 - at / per_step)
            ranks.append([r, latest, last, issued, now_ns, None, False,
                          self._state(r, issued, per_step, stopped_s)])
        payload = {"host": f"node{self.node:03d}", "ranks": ranks,
                   "groups": {} if self.groups_sent else self.groups(),
                   "sigs": {"0": _sig_row(64), "1": _sig_row(65)} if not self.groups_sent
                   else {}, "arrivals": runs(arrivals), "waits": waits, "dropped": 0}
        self.groups_sent = True
        return payload

    def _state(self, r: int, issued: dict, per_step: int, stopped_s: float | None) -> dict:
        """What a node's engine says of a rank beyond its position (Engine.rank_summary),
        its progress as its node read it included: the rank that stopped is idle since."""
        tp, dp = issued[self.tp(r)], issued[self.dp(r)]
        steps = dp // DP_OPS
        progress = ([True, 0.0, None, "busy: 97% CPU", 0.2, False] if stopped_s is None
                    else [False, round(stopped_s, 1), None, "idle: 0% CPU",
                          round(stopped_s, 1), False])
        return {"failed": False, "span": f"step {steps}", "steps": steps,
                "progress": progress,
                "split": {"steps": 10, "wall_ms": 1000.0, "collective_ms": 180.5,
                          "data_ms": 20.25, "compute_ms": 799.25},
                "late_ms": 0.4, "hb_age_s": 0.3,
                "done": [[self.tp(r), "tp", "all_reduce", tp, tp * 0.0018],
                         [self.dp(r), "dp", "all_reduce", dp, dp * 0.0018]]}

    def _op(self, r: int, i: int, per_step: int) -> tuple[str, int]:
        step, j = divmod(i, per_step)
        if j < TP_OPS:
            return self.tp(r), step * TP_OPS + j
        return self.dp(r), step * DP_OPS + (j - TP_OPS)

    @staticmethod
    def _next_dp(i: int, per_step: int) -> int:
        while i % per_step < TP_OPS:
            i += 1
        return i

    def _issued(self, r: int, ops: int, per_step: int) -> dict:
        step, j = divmod(ops, per_step)
        return {self.tp(r): step * TP_OPS + min(j, TP_OPS),
                self.dp(r): step * DP_OPS + max(0, j - TP_OPS)}


def blocked_after(culprit: int, at: int, nodes: list[Node], per_step: int) -> dict:
    """Where every rank stops once `culprit` stops before op `at`: a rank waits in the
    first op of a group whose member stopped earlier (its TP peers in that TP op, their
    DP groups in their next DP op, those ranks' TP peers next, ...), as a real job
    grinds to a halt."""
    node0 = nodes[0]
    groups: dict[str, list[int]] = {}
    for r in range(len(nodes) * node0.per_node):
        groups.setdefault(node0.tp(r), []).append(r)
        groups.setdefault(node0.dp(r), []).append(r)
    blocked = {culprit: at}
    changed = True
    while changed:
        changed = False
        for name, members in groups.items():
            first = min((blocked[m] for m in members if m in blocked), default=None)
            if first is None:
                continue
            for r in members:
                i = first
                while node0._op(r, i, per_step)[0] != name:
                    i += 1
                if r != culprit and i < blocked.get(r, 1 << 62):
                    blocked[r] = i
                    changed = True
    return blocked


def _row(index: int, group: str, seq: int, t_ns: int, done: bool) -> list:
    return [index, "collective", "all_reduce", "ok" if done else "in_flight", group, seq,
            None, [[4096]], ["bfloat16"], 4096, 4096, "sum", SITE, t_ns,
            t_ns + 1_000_000 if done else None, None]


def _sig_row(numel: int) -> list:
    return [0, "collective", "all_reduce", "ok", "dp0", 0, None, [[numel]], ["bfloat16"],
            numel, numel, "sum", SITE, 0, 1, None]


def _findings(copy: str) -> list[dict]:
    try:
        with open(os.path.join(copy, "findings.json")) as f:
            return json.load(f)["findings"]
    except (OSError, ValueError, KeyError):
        return []


class CollectorProcess:
    def __init__(self, port: int, copy: str, hang_timeout: str, env: dict | None = None):
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "distdoctor", "watch", "--listen", f"127.0.0.1:{port}",
             copy, "--hang-timeout", hang_timeout],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            env=dict(os.environ, PYTHONUNBUFFERED="1", **(env or {})),
            # run from the copy's folder: `python -m` puts its folder first on the path,
            # and from inside a checkout that checkout's distdoctor would be the one run
            # (collector_scale.py --old's copy was not)
            cwd=copy, start_new_session=True)
        self.lines: list[tuple[float, str]] = []
        threading.Thread(target=self._read, daemon=True).start()
        self.ps = psutil.Process(self.proc.pid)
        self.peak_rss = 0

    def _read(self) -> None:
        for raw in self.proc.stderr:
            self.lines.append((time.monotonic(), raw.decode(errors="replace")))

    def wait_for(self, text: str, timeout_s: float) -> float | None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for t, line in list(self.lines):
                if text in line:
                    return t
            time.sleep(0.05)
        return None

    def cpu_s(self) -> float:
        t = self.ps.cpu_times()
        return t.user + t.system

    def sample_rss(self) -> None:
        self.peak_rss = max(self.peak_rss, self.ps.memory_info().rss)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--ranks-per-node", type=int, default=64)
    ap.add_argument("--hang-timeout", default="auto", help="auto (by progress) or seconds")
    ap.add_argument("--seconds", type=float, default=40.0)
    ap.add_argument("--late-node", type=int, default=None,
                    help="this node's digests arrive --late-s seconds late")
    ap.add_argument("--late-s", type=float, default=10.0)
    ap.add_argument("--late-from", type=float, default=8.0,
                    help="seconds into the run when that node's reports start to lag")
    ap.add_argument("--thin", type=int, default=1,
                    help="every node sends a digest every THIN rounds (a loaded machine)")
    args = ap.parse_args()
    world = args.nodes * args.ranks_per_node
    port = free_port()
    copy = tempfile.mkdtemp(prefix="dd-fleet-")
    collector = CollectorProcess(port, copy, args.hang_timeout)
    try:
        assert collector.wait_for("collecting on", 30), "the collector did not start"
        nodes = [Node(n, args.ranks_per_node, args.nodes).connect(port)
                 for n in range(args.nodes)]
        per_s = TP_OPS + DP_OPS
        # faults: a mismatch at 10 s (a rank of the middle node, in a DP all_reduce), a
        # hang at 15 s (a rank of another node stops before a TP all_reduce)
        odd = (args.nodes // 2) * args.ranks_per_node + 3
        stuck = (args.nodes // 3) * args.ranks_per_node + 5
        # and a straggler from 3 s (a rank of a third node keeps its DP group waiting
        # 20 ms in each of its DP all_reduces: 400 ms a step)
        slow = (2 * args.nodes // 3) * args.ranks_per_node + 9
        faults = {"mismatch": (odd, 10 * per_s + TP_OPS + 4), "hang": (stuck, 15 * per_s + 7),
                  "straggler": (slow, 3 * per_s, 20.0)}
        blocked = blocked_after(stuck, faults["hang"][1], nodes, per_s)
        t0, t0_ns = time.monotonic(), time.monotonic_ns()
        cpu0, sent_mismatch_t, hang_t = collector.cpu_s(), None, None
        frames, bytes_sent, build_s, rounds = 0, 0, 0.0, 0
        while time.monotonic() - t0 < args.seconds:
            tick = time.monotonic()
            done = int((tick - t0) * per_s)
            if hang_t is None and done >= faults["hang"][1]:
                hang_t = t0 + faults["hang"][1] / per_s
                faults["blocked"] = blocked
            rounds += 1
            for node in nodes:
                if rounds % args.thin == 0:
                    b0 = time.monotonic()
                    data = node.digest(done, node.prev, time.monotonic_ns(), t0_ns, faults)
                    build_s += time.monotonic() - b0
                    node.prev = done
                    late = (args.late_s if node.node == args.late_node
                            and tick - t0 >= args.late_from else 0.0)
                    node.held.append((time.monotonic() + late, data, done))
                while node.held and node.held[0][0] <= time.monotonic():
                    _, data, upto = node.held.pop(0)
                    node.sock.sendall(data)
                    frames += 1
                    bytes_sent += len(data)
                    if (sent_mismatch_t is None and odd in node.ranks
                            and upto > faults["mismatch"][1]):
                        sent_mismatch_t = time.monotonic()  # the digest that carried it
            collector.sample_rss()
            time.sleep(max(0.0, 0.5 - (time.monotonic() - tick)))
        wall = time.monotonic() - t0
        cores = (collector.cpu_s() - cpu0) / wall
        found_straggler = collector.wait_for("STRAGGLER", 1)
        found_mismatch = collector.wait_for("MISMATCH", 1)
        found_hang = collector.wait_for("HANG", 1)
        hangs = [f for f in _findings(copy) if f["kind"] in ("hang", "deadlock")]
        print(f"{args.nodes} nodes x {args.ranks_per_node} ranks = {world:,} ranks, "
              f"{per_s} collectives/s a rank ({world * per_s:,}/s in all), digests twice a "
              f"second: {frames:,} frames, {bytes_sent / wall / 1e6:.1f} MB/s "
              f"(the simulator spent {build_s / wall:.2f} of a core building them)")
        print(f"  collector: {cores:.2f} cores on average over {wall:.0f} s, peak RSS "
              f"{collector.peak_rss / 2**20:,.0f} MiB")
        if found_mismatch and sent_mismatch_t:
            print(f"  mismatch (rank {odd}, on another node than most of its DP group): "
                  f"found {found_mismatch - sent_mismatch_t:.1f} s after the digest that "
                  f"carried it")
        else:
            print("  mismatch: NOT FOUND")
        if args.late_node is not None or args.thin > 1:
            print(f"  reports: node{args.late_node:03d} {args.late_s:g} s late from "
                  f"{args.late_from:g} s" if
                  args.late_node is not None else "  reports: on time", end="")
            print(f", every node's {args.thin}x sparser" if args.thin > 1 else "")
        rule = (f"hang timeout {args.hang_timeout} s" if args.hang_timeout != "auto"
                else "by progress, no timeout")
        if found_hang and hang_t:
            print(f"  hang (rank {stuck} stops; {rule}): found "
                  f"{found_hang - hang_t:.1f} s after it stopped; {len(hangs)} hang "
                  f"finding(s), blaming {sorted({r for f in hangs for r in f['ranks']})}")
        else:
            print(f"  hang: NOT FOUND ({len(hangs)} hang finding(s))")
        if found_straggler:
            print(f"  straggler (rank {slow} keeps its DP group waiting 20 ms per DP "
                  f"collective from 3 s): found {found_straggler - t0 - 3:.1f} s after it "
                  f"slowed")
        else:
            print("  straggler: NOT FOUND")
        if os.environ.get("PROFILE"):
            subprocess.run(["py-spy", "dump", "--pid", str(collector.proc.pid)])
        late = [f for f in _findings(copy) if f["kind"] == "host"]
        print(f"  nodes whose reports came late (host findings): {len(late)}"
              + (f", e.g. {late[0]['summary'][:60]}" if late else ""))
        for f in _findings(copy):
            if f["kind"] != "host":
                print(f"    {f['kind'].upper()}: {f['summary'][:200]}")
    finally:
        collector.stop()


if __name__ == "__main__":
    main()
