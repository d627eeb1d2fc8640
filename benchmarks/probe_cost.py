"""Cost of one sampler tick (CPU time), as measured in one run.

1. host probe: the node's CPU/load/memory/network and R rank processes (sleeping children),
   with NVML absent (this machine) -- the real cost on a CPU node;
2. the same plus 8 GPUs replayed from a fixture through the live NVML probe code: the
   probe's own Python cost per GPU (a live driver adds its call latency; the budget in
   issue 5 is 5 ms of CPU per GPU per sample on a GPU machine);
3. py-spy dump of one stuck process (wall time), for scale.

CPU time is the sampling thread's own (time.thread_time), median of REPEATS runs of TICKS
ticks each, including writing the line to the run dir. Reported beside the 1 s interval: the
fraction of one core the sampler uses.

    python benchmarks/probe_cost.py [--ticks 200] [--repeats 5] [--ranks 8]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from distdoctor.probes.nvml import NvmlProbe
from distdoctor.probes.nvml_replay import ReplayNvml
from distdoctor.probes.sampler import Sampler
from distdoctor.probes.stacks import dump_stacks, find_py_spy

FIXTURE = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "nvml" / \
    "h100_hw_thermal.json"
EIGHT = {r: {"local_rank": r} for r in range(8)}


def cpu_per_tick(sampler: Sampler, ticks: int, repeats: int) -> float:
    sampler.tick()  # warm: psutil process objects, NVML discovery, open file
    runs = []
    for _ in range(repeats):
        t0 = time.thread_time()
        for _ in range(ticks):
            sampler.tick()
        runs.append((time.thread_time() - t0) / ticks)
    return statistics.median(runs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ticks", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--ranks", type=int, default=8)
    args = ap.parse_args()
    kids = [subprocess.Popen(["sleep", "600"]) for _ in range(args.ranks)]
    pids = {r: p.pid for r, p in enumerate(kids)}
    try:
        with tempfile.TemporaryDirectory() as run_dir:
            host = Sampler(Path(run_dir) / "a", lambda: pids)
            host_s = cpu_per_tick(host, args.ticks, args.repeats)
            host.stop()
            replay = Sampler(Path(run_dir) / "b", lambda: pids, nvml=NvmlProbe(
                ReplayNvml(FIXTURE)), rank_info=lambda: EIGHT)
            both_s = cpu_per_tick(replay, args.ticks, args.repeats)
            gpus = len(replay.latest().gpus)
            replay.stop()
        print(f"host probe, {args.ranks} rank processes, no NVML: "
              f"{host_s * 1e3:.3f} ms CPU per tick = {host_s:.2%} of one core at 1 Hz")
        per_gpu = (both_s - host_s) / gpus
        print(f"+ {gpus} GPUs replayed through the NVML probe: {both_s * 1e3:.3f} ms CPU per "
              f"tick; {per_gpu * 1e3:.3f} ms per GPU = {per_gpu / 5e-3:.3f} of the 5 ms budget")
    finally:
        for p in kids:
            p.kill()
            p.wait()
    if find_py_spy():
        stuck = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(1)"])
        try:
            time.sleep(0.5)
            t0 = time.perf_counter()
            d = dump_stacks({0: stuck.pid})[0]
            print(f"py-spy dump of one process: {(time.perf_counter() - t0) * 1e3:.0f} ms wall "
                  f"({d.method})")
        finally:
            stuck.kill()
            stuck.wait()


if __name__ == "__main__":
    main()
