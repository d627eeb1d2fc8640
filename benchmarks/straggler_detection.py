"""How many steps after its onset a straggler without spans is found, live (issue 15).

Runs tests/jobs/stragglers/onset_extra_compute.py-like jobs (4 gloo ranks, DDP, no spans:
the steps are the optimizer's) under `distdoctor run`, with the slow rank's extra work
(--extra-ms per step) starting at --onset. Every rank logs (step, wall time) to a file; the
benchmark reads `run`'s stderr as it comes and notes the wall time the STRAGGLER line
arrives. Steps to detection: how many steps the slow rank had begun after the onset when
the line arrived. Also: whether the finding named the right rank, cause and function.

    python benchmarks/straggler_detection.py [--runs 3] [--extra-ms 25] [--onset 40]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

JOB = r'''
import json, os, sys, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
onset, extra_s, steps = int(sys.argv[1]), float(sys.argv[2]) / 1000, int(sys.argv[3])
log = open(os.path.join(sys.argv[4], f"steps-{rank}.jsonl"), "w", buffering=1)

def extra_diagnostics(model):
    end = time.perf_counter() + extra_s
    while time.perf_counter() < end:
        sum(p.detach().abs().sum() for p in model.parameters())

model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(32, 32))
opt = torch.optim.Adam(model.parameters())
for step in range(steps):
    log.write(json.dumps([step, time.time()]) + "\n")
    loss = model(torch.randn(8, 32)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    if rank == 3 and step >= onset:
        extra_diagnostics(model)
dist.destroy_process_group()
'''


def one(args, tmp: str) -> dict:
    job = os.path.join(tmp, "job.py")
    with open(job, "w") as f:
        f.write(JOB)
    run_dir = os.path.join(tmp, "run")
    proc = subprocess.Popen(
        [sys.executable, "-m", "distdoctor", "run", "--nproc", "4", "--run-dir", run_dir,
         "--", sys.executable, job, str(args.onset), str(args.extra_ms), str(args.steps), tmp],
        stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL,
        text=True)
    found_at = None
    for line in proc.stderr:
        if found_at is None and "STRAGGLER" in line:
            found_at = time.time()
    proc.wait(timeout=300)
    with open(os.path.join(tmp, "steps-3.jsonl")) as f:
        starts = [json.loads(x) for x in f]
    begun = [s for s, t in starts if found_at is not None and t <= found_at]
    findings = json.load(open(os.path.join(run_dir, "findings.json")))["findings"]
    stragglers = [f for f in findings if f["kind"] == "straggler"]
    top = stragglers[0]["details"].get("top_frames") if stragglers else None
    return {"steps_after_onset": (max(begun) - args.onset + 1) if begun else None,
            "ranks": [f["ranks"] for f in stragglers],
            "cause": stragglers[0]["details"].get("cause") if stragglers else None,
            "function": top[0]["function"] if top else None,
            "onset_step": stragglers[0]["details"].get("onset_step") if stragglers else None}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--extra-ms", type=float, default=25.0)
    ap.add_argument("--onset", type=int, default=40)
    ap.add_argument("--steps", type=int, default=100)
    args = ap.parse_args()
    print(f"4 gloo ranks, DDP, no spans; rank 3 does {args.extra_ms:.0f} ms of extra work "
          f"per step from step {args.onset} of {args.steps}")
    for i in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="dd-strag-") as tmp:
            r = one(args, tmp)
        print(f"  run {i + 1}: found {r['steps_after_onset']} steps after the onset; "
              f"ranks {r['ranks']}, cause {r['cause']}, in {r['function']}, "
              f"onset reported as {r['onset_step']!r}")


if __name__ == "__main__":
    main()
