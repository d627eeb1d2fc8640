"""What the main-thread sampler (tracer/steps.py) costs the training thread (issue 15).

1. One look: `Sampler.sample()` called in a loop from a thread, the main thread inside a
   user function a few frames deep: microseconds per look, x SAMPLE_HZ = CPU share.
2. In place: the main thread runs a dispatch-bound loop of small torch ops (what a Python
   training loop does between collectives); blocks alternate between the sampler thread
   running (at --hz) and not, inside one process. Slowdown: median block time with over
   without, all blocks pooled, with a 90% bootstrap interval over block pairs.

    python benchmarks/sampler_cost.py [--hz 50] [--blocks 40] [--iters 20000]
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import threading
import time

import torch

from distdoctor.runlog.ring import RingWriter
from distdoctor.tracer import state, steps
from distdoctor.tracer.recorder import Recorder


def _work(iters: int) -> float:
    a = torch.ones(8)
    start = time.perf_counter()
    for _ in range(iters):
        a = a * 1.0001 + 0.5
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hz", type=float, default=steps.SAMPLE_HZ)
    ap.add_argument("--blocks", type=int, default=40)
    ap.add_argument("--iters", type=int, default=20000)
    args = ap.parse_args()

    run_dir = tempfile.mkdtemp(prefix="dd-sampler-")
    rec = Recorder(RingWriter(f"{run_dir}/rank-00000.ring", 0, 8 << 20, 1 << 20))
    state.recorder = rec
    # the look itself: this sampler's own thread never wakes (a period of ~30 years)
    sampler = steps.Sampler(rec, 1e-9)

    # 1. one look, taken while the main thread sits in a user function
    looks, done = [], threading.Event()

    def looker():
        t0 = time.perf_counter()
        n = 0
        while time.perf_counter() - t0 < 1.0:
            sampler.sample()
            n += 1
        looks.append((time.perf_counter() - t0) / n)
        done.set()

    threading.Thread(target=looker).start()
    while not done.is_set():
        _work(200)
    per_look_us = looks[0] * 1e6
    print(f"one look: {per_look_us:.1f} us (with the main thread busy beside it); at "
          f"{args.hz:.0f} Hz that is {per_look_us * args.hz / 1e4:.3f}% of a core")

    # 2. in place: the loop with and without a sampler thread at --hz
    stop = threading.Event()
    on = threading.Event()

    def sampling():
        while not stop.wait(1.0 / args.hz):
            if on.is_set():
                sampler.sample()

    threading.Thread(target=sampling, daemon=True).start()
    _work(args.iters)  # warm-up
    times = {"off": [], "on": []}
    for b in range(args.blocks):
        for name in (("off", "on") if b % 2 else ("on", "off")):
            on.set() if name == "on" else on.clear()
            times[name].append(_work(args.iters))
    stop.set()
    ratio = statistics.median(times["on"]) / statistics.median(times["off"])
    rnd = random.Random(0)
    boots = []
    for _ in range(2000):
        idx = [rnd.randrange(args.blocks) for _ in range(args.blocks)]
        boots.append(statistics.median(times["on"][i] for i in idx)
                     / statistics.median(times["off"][i] for i in idx))
    boots.sort()
    print(f"in place: {args.blocks} blocks of {args.iters} small torch ops, sampler at "
          f"{args.hz:.0f} Hz on / off: {ratio:.3f} ({boots[100]:.3f}-{boots[1899]:.3f})")
    rec.close()


if __name__ == "__main__":
    main()
