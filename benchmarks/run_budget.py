"""What `distdoctor run`'s own process costs: CPU of one core while it follows a busy job.

    python benchmarks/run_budget.py [--ranks 8] [--rate 1000] [--seconds 12]

The job: `distdoctor run --nproc RANKS` of ranks that each issue RATE traced all-reduces a
second (in bursts of 10 every 10 ms) for SECONDS. The ranks use torch's fake backend, so
they cost the machine next to nothing and never wait on each other: everything `run` has
to do (read every event of every rank, match each op across the ranks, check liveness,
sample the probes, relay and scan the output) is there, at a rate a 2-core machine could
not drive through gloo. Measured: the CPU time of `run`'s process (all its threads) and
of the guardian it starts, over the job's steady middle (the first and last 2 s left out),
as a share of one core. Goal: at most 5% at 8 ranks x 1,000 collectives/s.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time

CLK_TCK = os.sysconf("SC_CLK_TCK")


def rank(rate: int, seconds: float) -> None:
    import torch
    import torch.distributed as dist
    import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers "fake")

    from distdoctor.tracer import install

    install._BUILTIN_BACKENDS.add("fake")  # trace it as gloo is traced
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # a real store, shared as a real job's is: the ranks agree on their run dir and launch
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                          is_master=rank == 0)
    dist.init_process_group("fake", store=store, rank=rank, world_size=world)
    t = torch.ones(16)
    burst, period = 10, 10 / rate
    deadline = time.monotonic() + seconds
    next_t = time.monotonic()
    while time.monotonic() < deadline:
        for _ in range(burst):
            dist.all_reduce(t)
        next_t += period
        delay = next_t - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    dist.destroy_process_group()


def cpu_seconds(pid: int) -> float:
    """utime + stime of the process (all its threads, not its children)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def children(pid: int) -> list[int]:
    out = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                out += [int(p) for p in f.read().split()]
        except OSError:
            pass
    return out


def guardians(run_pid: int) -> list[int]:
    """run's own helper processes (not the ranks): the guardian."""
    found = []
    for pid in children(run_pid):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if b"guardian" in f.read():
                    found.append(pid)
        except OSError:
            pass
    return found


def main() -> int:
    if "--rank" in sys.argv:
        i = sys.argv.index("--rank")
        rank(int(sys.argv[i + 1]), float(sys.argv[i + 2]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--rate", type=int, default=1000, help="collectives per second per rank")
    ap.add_argument("--seconds", type=float, default=12.0)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-run-budget-") as tmp:
        run = subprocess.Popen(
            [sys.executable, "-m", "distdoctor", "run", "--nproc", str(args.ranks),
             "--run-dir", os.path.join(tmp, "run"), "--", sys.executable,
             os.path.abspath(__file__), "--rank", str(args.rate), str(args.seconds)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            text=True)
        time.sleep(4.0)  # the ranks start (8 torch imports on this machine) and settle
        helpers = guardians(run.pid)
        pids = [run.pid, *helpers]
        c0, t0 = sum(cpu_seconds(p) for p in pids), time.monotonic()
        window = max(1.0, args.seconds - 6.0)
        time.sleep(window)
        c1, t1 = sum(cpu_seconds(p) for p in pids), time.monotonic()
        out, _ = run.communicate(timeout=300)
    share = (c1 - c0) / (t1 - t0)
    events = args.ranks * args.rate * (t1 - t0)
    print(f"{args.ranks} ranks x {args.rate} collectives/s, {t1 - t0:.1f} s window: run's "
          f"process{' + guardian' if helpers else ''} used {share * 100:.2f}% of one core "
          f"({(c1 - c0) / events * 1e6:.2f} us per event); job exit {run.returncode}")
    print("  " + "\n  ".join(out.strip().splitlines()[-3:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
