"""Check a job's nodes, ranks and links before it starts: one table, a remedy per problem.

  distdoctor check --nproc 8                          # this node, 8 local ranks
  distdoctor check --nproc 8 --checkpoint-dir /ckpt --json
  distdoctor check -- torchrun --nnodes 4 --node-rank 0 --nproc-per-node 8 \\
      --master-addr head --master-port 29500 train.py  # on every node, the job's own line

A short job runs on the ranks the training job will use (with a torchrun line, the same
line with the check in place of the script): versions, NCCL/gloo settings and their
values, /dev/shm, the checkpoint directory, limits, memory, each rank's GPU and the
node's GPU health (NVML), clock offsets, an all-reduce whose sum is known and a pairwise
bandwidth sweep. The rendezvous (address reachable, port free) is checked first. Rows are
ok, warn, fail, or n/a (nothing to check: no GPU, no RDMA device); exit code 1 on any fail.
"""

from __future__ import annotations

import argparse

from distdoctor.cli import common
from distdoctor.errors import UserError
from distdoctor.launch.env import check_nproc

TIMEOUT_S = 120.0
RENDEZVOUS_WAIT_S = 60.0  # a worker node waits this long for the first node's store


def register(sub) -> None:
    p = sub.add_parser("check", help="pre-launch check of nodes, ranks and links",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nproc", type=int, metavar="N", help="start N local ranks")
    p.add_argument("--checkpoint-dir", metavar="DIR",
                   help="where the job writes checkpoints: free space and writable")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    p.add_argument("--no-sweep", action="store_true", help="skip the pairwise bandwidth sweep")
    p.add_argument("--timeout", type=common.seconds_arg, default=TIMEOUT_S, metavar="S",
                   help=f"give up on ranks that have not finished after S seconds ({TIMEOUT_S:g})")
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- LAUNCHER ...",
                   help="the job's torchrun line")
    p.set_defaults(func=run)


def run(args) -> int:
    import json
    import os
    import time

    from distdoctor.check import local, preflight, rules, table

    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if (args.nproc is None) == (not cmd):
        raise UserError("check: give --nproc N or the job's torchrun line after --", 2)
    if why := check_nproc(args.nproc, "check"):
        raise UserError(why, 2)
    start = time.monotonic()
    launcher = preflight.check_command(cmd) if cmd else None
    host, port, hosts_store = preflight.rendezvous_of(cmd, os.environ)
    rows = preflight.check(host, port, hosts_store, min(args.timeout, RENDEZVOUS_WAIT_S))
    # what this node shows without the other ranks, before any of them starts
    before = local.rows(os.environ, args.checkpoint_dir, preflight.multi_node(cmd))
    rows += before
    world = None
    stop = local.blocking(before)
    if launcher is not None and any(r.status == "fail" for r in rows if r not in before):
        rows.append(table.Row("ranks", "job", "fail", "not started: the rendezvous failed "
                              "(the job would fail the same way)", "fix the rows above"))
    elif stop:
        names = ", ".join(sorted({r.found.split("=", 1)[0] for r in stop}))
        rows.append(table.Row("ranks", "job", "fail", f"not started: {names} would stop "
                              f"every rank's init_process_group (the job would fail the "
                              f"same way)", "fix the rows above"))
    else:
        from distdoctor.check.launch import run_ranks

        job, failure, remedy = run_ranks(args.nproc, launcher, args.checkpoint_dir,
                                         not args.no_sweep, args.timeout)
        if job is None:
            rows.append(table.Row("ranks", "job", "fail", failure, remedy or
                                  "run the job's line by hand on this node: the first error "
                                  "it prints is the problem"))
        else:
            world = job["world_size"]
            rows = local.merge(rows, rules.rows(
                job, multi_node=len({f["host"] for f in job["ranks"]}) > 1))
    seconds = time.monotonic() - start
    if args.json:
        print(json.dumps(table.as_json(rows, seconds, world), indent=1))
    else:
        import sys

        from rich.console import Console

        # a pipe or a log gets whole rows: rich would fold five columns into 80
        table.render(rows, Console(width=None if sys.stdout.isatty() else 200,
                                   highlight=False), seconds, world)
    return 1 if any(r.status == "fail" for r in rows) else 0
