"""Tracing overhead, as ratios measured in one run (numbers go in the README).

1. 2 gloo ranks, a loop of 1-element all_reduce: time per op traced / untraced, beside
   the same ratio for TORCH_DISTRIBUTED_DEBUG=DETAIL and for the Flight Recorder.
2. The tracer's own cost per call: torch's fake backend (no communication and no worker
   thread), traced minus untraced time per call. A world of one on gloo is no good for
   this: its worker-thread hand-off makes any few microseconds of Python on the calling
   thread cost several times that (measured: 4 us of plain Python added ~8 us a call).

Each configuration runs REPEATS times, interleaved, and the median is kept, so a noisy
neighbour on the machine hurts every configuration alike.

    python benchmarks/tracer_overhead.py [--iters 3000] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

WORKER = os.path.abspath(__file__)


def worker(iters: int, fake: bool) -> None:
    import torch
    import torch.distributed as dist

    if fake:
        from torch.testing._internal.distributed.fake_pg import FakeStore

        from distdoctor.tracer import install

        install._BUILTIN_BACKENDS.add("fake")  # trace it here, as gloo is traced
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=4)
    else:
        dist.init_process_group("gloo")
    t = torch.ones(1)
    for _ in range(200):
        dist.all_reduce(t)
    dist.barrier()
    best = float("inf")
    for _ in range(3 if fake else 1):  # fake: nothing but CPU, so the best of 3 is its cost
        start = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(t)
        best = min(best, time.perf_counter() - start)
    if dist.get_rank() == 0:
        print(f"US_PER_OP {best / iters * 1e6:.3f}")
    dist.destroy_process_group()


def launch(nproc: int, iters: int, extra_env: dict, traced: bool, fake: bool = False) -> float:
    from distdoctor.launch.env import free_port, rank_env, traced_env

    base = {k: v for k, v in os.environ.items() if not k.startswith(("DISTDOCTOR", "TORCH_"))}
    base.update(extra_env)
    run_dir = tempfile.mkdtemp(prefix="dd-bench-")
    env = traced_env(run_dir, base) if traced else base
    port = free_port()
    procs = [subprocess.Popen([sys.executable, WORKER, "--worker", str(iters),
                               *(["--fake"] if fake else [])],
                              env=rank_env(env, r, nproc, port), stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True, stdin=subprocess.DEVNULL)
             for r in range(nproc)]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    for line in outs[0].splitlines():
        if line.startswith("US_PER_OP"):
            return float(line.split()[1])
    raise RuntimeError(f"worker failed: {outs}")


CONFIGS = {
    "untraced": ({}, False),
    "distdoctor": ({}, True),
    "TORCH_DISTRIBUTED_DEBUG=DETAIL": ({"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}, False),
    "Flight Recorder (TORCH_FR_BUFFER_SIZE=20000)": ({"TORCH_FR_BUFFER_SIZE": "20000"}, False),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=3000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--fake", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args.worker, args.fake)

    print(f"2 gloo ranks, {args.iters} x all_reduce(1 element), median of {args.repeats}")
    times = {name: [] for name in CONFIGS}
    for _ in range(args.repeats):
        for name, (env, traced) in CONFIGS.items():
            times[name].append(launch(2, args.iters, env, traced))
    base = statistics.median(times["untraced"])
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"  {name:46s} {med:8.1f} us/op   ratio {med / base:5.3f}")

    print(f"\nthe tracer's own cost: fake backend (no communication), {args.iters * 10} "
          f"calls, median of {args.repeats}")
    one = {"untraced": [], "traced": []}
    for _ in range(args.repeats):
        one["untraced"].append(launch(1, args.iters * 10, {}, False, fake=True))
        one["traced"].append(launch(1, args.iters * 10, {}, True, fake=True))
    u, t = statistics.median(one["untraced"]), statistics.median(one["traced"])
    print(f"  untraced {u:.2f} us/call, traced {t:.2f} us/call: tracing adds "
          f"{t - u:.2f} us per call")


if __name__ == "__main__":
    main()
