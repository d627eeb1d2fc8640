"""What following GPU work's completion costs the thread that feeds the GPU (issue 14).

A CPU stand-in for a GPU training loop: the main thread runs a dispatch-bound loop of small
torch ops (what a Python training loop does while the GPU computes), and some CUDA op is
always in flight. The stand-in CUDA works are real pybind `Work` objects whose
`is_completed()` answers False (as a WorkNCCL's does while its end event is pending), so
every look at them is the same kind of GIL-holding pybind call as on a GPU.

Configurations, alternated in blocks inside one process (median of paired ratios, spread):
- none:    no tracer;
- poll:    the design before issue 14: a thread looking at the pending works every 0.2 ms;
- sweeper: the tracer's PendingCompletions: its sweeper thread every SWEEP_S;
- +entry:  and the oldest pending works looked at on the main thread every --op-every
           iterations, as the next op's entry does (that part is the recorder's per-op cost
           rather than contention).
A slowdown is the configuration's median block time over none's, all blocks pooled, with
a 90% bootstrap interval over blocks.

    python benchmarks/completion_standin.py [--blocks 40] [--iters 20000] [--in-flight 4]
"""

from __future__ import annotations

import argparse
import random
import statistics
import threading
import time

import torch
import torch.distributed as dist

from distdoctor.tracer import completion
from distdoctor.tracer.completion import PendingCompletions


class _NullRing:
    def complete(self, *args) -> None:
        pass


class OldPoll:
    """The CompletionWatcher this replaced: is_completed() every 0.2 ms while pending."""

    POLL_S = 0.0002

    def __init__(self, works):
        self.works, self.active = works, False
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while True:
            if self.active:
                for w in self.works:
                    w.is_completed()
            time.sleep(self.POLL_S)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--blocks", type=int, default=40)
    ap.add_argument("--iters", type=int, default=20000, help="loop iterations per block")
    ap.add_argument("--in-flight", type=int, default=4, help="CUDA works always pending")
    ap.add_argument("--op-every", type=int, default=50,
                    help="iterations between two ops entering (entry checks)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    works = [dist.Work() for _ in range(args.in_flight)]  # is_completed() stays False
    poll = OldPoll(works)
    pending = PendingCompletions(_NullRing(), lambda *a: None)
    x = torch.ones(16)

    def loop(entry_checks: bool) -> float:
        nonlocal x
        start = time.perf_counter()
        for i in range(args.iters):
            x = x * 1.0001 + 0.0001
            if entry_checks and i % args.op_every == 0:
                pending.check()
        return time.perf_counter() - start

    def run(config: str) -> float:
        poll.active = config == "poll"
        if config in ("sweeper", "+entry"):
            for w in works:
                pending.add_work(0, w)
        t = loop(entry_checks=config == "+entry")
        poll.active = False
        pending._pending = []
        time.sleep(0.01)
        return t

    configs = ("none", "poll", "sweeper", "+entry")
    for c in configs:  # warm-up
        run(c)
    times: dict[str, list[float]] = {c: [] for c in configs}
    for b in range(args.blocks):
        for c in (configs if b % 2 == 0 else configs[::-1]):
            times[c].append(run(c))
    print(f"main-thread loop: {args.iters} x small torch ops per block, {args.blocks} blocks "
          f"per configuration, {args.in_flight} CUDA stand-in works always in flight; "
          f"sweeper every {completion.SWEEP_S * 1000:.0f} ms, entry check every "
          f"{args.op_every} iterations")
    base = times["none"]
    print(f"  none     {statistics.median(base) / args.iters * 1e6:6.2f} us/iteration")
    rng = random.Random(14)
    for c in configs[1:]:
        def slowdown(blocks: list[int], c: str = c) -> float:
            return (statistics.median(times[c][b] for b in blocks)
                    / statistics.median(base[b] for b in blocks))
        idx = list(range(args.blocks))
        boot = sorted(slowdown(rng.choices(idx, k=len(idx))) for _ in range(2000))
        print(f"  {c:8s} {statistics.median(times[c]) / args.iters * 1e6:6.2f} us/iteration"
              f"   slowdown {slowdown(idx):.4f} (90%: {boot[100]:.3f}-{boot[1899]:.3f})")

if __name__ == "__main__":
    main()
