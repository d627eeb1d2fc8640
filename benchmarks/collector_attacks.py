"""The collector (`distdoctor watch --listen`) under the loads of issue 46, on loopback:

1. 50 nodes x 8 ranks forward to one collector started under `ulimit -n 1024`: how many
   of the 400 ranks reach the copy, and the collector's open descriptors.
2. 2,500 idle unauthenticated connections, reopened as the collector drops them (a flood
   that keeps its pressure), against a collector with a token under `ulimit -n 1024`:
   how many of 20 connections of a real node (the forwarder `run --forward` uses) get
   in, how long each took, and the collector's CPU and lines said meanwhile.

Each node is a real Forwarder (collect/forward.py) over a run dir of 8 rank logs of a
few completed collectives; the collector is a real process.

    python benchmarks/collector_attacks.py [--nodes 50] [--ranks-per-node 8]
                                           [--idle 2500] [--tries 20]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

from distdoctor.collect.forward import Forwarder
from distdoctor.launch.env import free_port
from distdoctor.runlog import format as F
from distdoctor.runlog.ring import RingWriter
from distdoctor.runlog.rundir import rank_meta_path, ring_path

# the collector tests' socket helpers (closed_ones: which flood sockets it closed)
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "security"))
from simnode import closed_ones  # noqa: E402

TOKEN = "bench-token-5d1e"
OPEN_FILES = 1024


class Collector:
    def __init__(self, copy: Path, env: dict | None = None, open_files: int = OPEN_FILES):
        self.port = free_port()
        self.lines: list[str] = []

        def limit():
            resource.setrlimit(resource.RLIMIT_NOFILE, (open_files, open_files))

        self.proc = subprocess.Popen(
            [sys.executable, "-m", "distdoctor", "watch", "--listen",
             f"127.0.0.1:{self.port}", str(copy)], stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=limit,
            start_new_session=True, env=dict(os.environ, PYTHONUNBUFFERED="1", **(env or {})))
        threading.Thread(target=self._read, daemon=True).start()
        self.ps = psutil.Process(self.proc.pid)
        deadline = time.monotonic() + 30
        while not any("collecting on" in x for x in self.lines):
            assert time.monotonic() < deadline and self.proc.poll() is None, self.lines
            time.sleep(0.05)

    def _read(self) -> None:
        for raw in self.proc.stderr:
            self.lines.append(raw.decode(errors="replace"))

    @property
    def address(self) -> tuple[str, int]:
        return "127.0.0.1", self.port

    def cpu_s(self) -> float:
        t = self.ps.cpu_times()
        return t.user + t.system

    def fds(self) -> int:
        return self.ps.num_fds()

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def node_run_dir(run_dir: Path, ranks: list[int]) -> None:
    (run_dir / "ranks").mkdir(parents=True)
    for rank in ranks:
        w = RingWriter(str(ring_path(run_dir, rank)), rank, 64 * F.SLOT_SIZE, 4096)
        rank_meta_path(run_dir, rank).write_text(json.dumps(
            {"rank": rank, "host": run_dir.name, "pid": 1000 + rank}))
        for seq in range(3):
            e = w.append(F.KIND_COLLECTIVE, F.OP_CODE["all_reduce"], 0, 0, 0, 0, seq, -1, 0,
                         1, 1, 1000 + seq, 0, 0)
            w.complete(e, F.STATUS_OK, 2000 + seq)
        w.close()


def many_nodes(tmp: Path, nodes: int, per_node: int) -> None:
    copy = tmp / "copy-nodes"
    c = Collector(copy)
    forwarders = []
    try:
        for n in range(nodes):
            run_dir = tmp / f"node{n:03d}"
            node_run_dir(run_dir, [n * per_node + i for i in range(per_node)])
            fwd = Forwarder(run_dir, c.address)
            fwd.host = run_dir.name
            fwd.tick()  # connects, sends its 8 logs; the connection stays open
            forwarders.append(fwd)
        world = nodes * per_node
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            rings = len(list((copy / "ranks").glob("*.ring")))
            if rings >= world:
                break
            time.sleep(0.2)
        connected = sum(" connected" in x for x in c.lines)
        print(f"{nodes} nodes x {per_node} ranks under ulimit -n {OPEN_FILES}: {rings} of "
              f"{world} ranks in the copy, {connected} of {nodes} nodes connected; the "
              f"collector holds {c.fds()} descriptors")
        errors = [x.strip() for x in c.lines if "Too many open files" in x or "EMFILE" in x]
        if errors:
            print(f"  said: {errors[0][:200]}")
    finally:
        for fwd in forwarders:
            fwd.stop()
        c.stop()


class Flood:
    """`n` idle connections, each reopened as soon as the collector closes it."""

    def __init__(self, address, n: int):
        self.address, self.n = address, n
        self.socks: list[socket.socket] = []
        self.opened = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._keep_up, daemon=True)

    def start(self) -> Flood:
        while len(self.socks) < self.n:
            self._open()
        self.thread.start()
        return self

    def _open(self) -> None:
        try:
            self.socks.append(socket.create_connection(self.address, timeout=5))
            self.opened += 1
        except OSError:
            time.sleep(0.01)

    def _keep_up(self) -> None:
        while not self.stop.wait(0.02):
            for s in closed_ones(self.socks):
                self.socks.remove(s)
                s.close()
            while len(self.socks) < self.n and not self.stop.is_set():
                self._open()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=10)
        for s in self.socks:
            s.close()


def flood_and_a_real_node(tmp: Path, idle: int, tries: int) -> None:
    c = Collector(tmp / "copy-flood", env={"DISTDOCTOR_TOKEN": TOKEN})
    flood = None
    try:
        cpu0, t0 = c.cpu_s(), time.monotonic()
        flood = Flood(c.address, idle).start()
        opened_s = time.monotonic() - t0
        got_in, took = 0, []
        for _ in range(tries):
            fwd = Forwarder(tmp, c.address, token=TOKEN)
            start = time.monotonic()
            ok = fwd._connect(final=False)
            took.append(time.monotonic() - start)
            got_in += ok
            if fwd._sock is not None:
                fwd._sock.close()
            time.sleep(0.25)
        wall = time.monotonic() - t0
        cores = (c.cpu_s() - cpu0) / wall
        took.sort()
        refusal_lines = sum("refused" in x for x in c.lines)
        print(f"{idle:,} idle unauthenticated connections (kept up: {flood.opened:,} opened "
              f"in {wall:.0f} s, the first {idle:,} in {opened_s:.1f} s) against a collector "
              f"under ulimit -n {OPEN_FILES}: a real node got in {got_in} of {tries} times "
              f"(median {took[len(took) // 2] * 1e3:.0f} ms, slowest {took[-1] * 1e3:.0f} "
              f"ms); the collector used {cores:.2f} of a core, held {c.fds()} descriptors, "
              f"and said {refusal_lines} refusal line(s)")
    finally:
        if flood is not None:
            flood.close()
        c.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=50)
    ap.add_argument("--ranks-per-node", type=int, default=8)
    ap.add_argument("--idle", type=int, default=2500)
    ap.add_argument("--tries", type=int, default=20)
    args = ap.parse_args()
    resource.setrlimit(resource.RLIMIT_NOFILE, resource.getrlimit(resource.RLIMIT_NOFILE)[1:] * 2)
    with tempfile.TemporaryDirectory(prefix="dd-attacks-") as tmp:
        many_nodes(Path(tmp), args.nodes, args.ranks_per_node)
        flood_and_a_real_node(Path(tmp), args.idle, args.tries)


if __name__ == "__main__":
    main()
