"""Measure collective bandwidth the way nccl-tests does, and find the slow link.

  distdoctor nccl-test --nproc 2 -b 1M -e 64M -f 2             # all_reduce, 2 local ranks
  distdoctor nccl-test all --nproc 8 -b 8 -e 1G -f 2 --json out.json
  distdoctor nccl-test --nproc 8 --pairwise -e 64M             # every pair: who is slow?
  torchrun --nnodes 4 --nproc-per-node 8 ... -m distdoctor nccl-test all_gather \\
      -b 1M -e 4G -f 2 --split rail                            # per-rail, all nodes

Ops are named as nccl-tests' binaries: all_reduce (default), all_gather, reduce_scatter,
broadcast, reduce, all_to_all, gather, scatter, sendrecv, or all. Options keep nccl-tests'
letters and defaults. The table is nccl-tests' column for column (GB = 1e9; busbw =
algbw x 2(n-1)/n for all_reduce, (n-1)/n for all_gather, reduce_scatter, all_to_all,
gather and scatter, 1 for broadcast, reduce and sendrecv). Under torchrun (RANK and
WORLD_SIZE set) each rank runs this command; with --nproc N it starts N local ranks itself.
--split marks a group SLOW below --slow-fraction x the median group (three groups or more).
Exit code 1 when a result is wrong, a combination asked for by name cannot run, or
--pairwise finds a slow pair.
"""

from __future__ import annotations

import argparse
import os

from distdoctor.errors import UserError

_SPLIT_HELP = ("run in parallel groups: node, rail, or an NCCL_TESTS_SPLIT rule "
               "('MOD k', 'DIV k', 'AND mask', 'OR mask')")


def register(sub) -> None:
    p = sub.add_parser("nccl-test", help="collective bandwidth sweep (options as nccl-tests)",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("ops", nargs="*", metavar="OP", help="ops to run (default all_reduce; all)")
    size = p.add_argument_group("sizes (K, M, G suffixes are powers of 2)")
    size.add_argument("-b", "--minbytes", default="32M", metavar="SIZE", help="first size (32M)")
    size.add_argument("-e", "--maxbytes", default="32M", metavar="SIZE", help="last size (32M)")
    size.add_argument("-i", "--stepbytes", default="1M", metavar="SIZE",
                      help="step added between sizes when -f is 1 (1M)")
    size.add_argument("-f", "--stepfactor", default=1, type=int, metavar="F",
                      help="factor between sizes (1 = step by -i)")
    oper = p.add_argument_group("operation")
    oper.add_argument("-d", "--datatype", default="float", metavar="TYPE",
                     help="int8 uint8 int32 uint32 int64 uint64 half float double bfloat16, "
                     "a comma list, or all (float)")
    oper.add_argument("-o", "--op", default="sum", metavar="REDOP",
                     help="sum prod max min avg, a comma list, or all (sum)")
    oper.add_argument("-r", "--root", default="0", metavar="ROOT",
                     help="root of broadcast, reduce, gather, scatter; or all (0)")
    perf = p.add_argument_group("performance")
    perf.add_argument("-n", "--iters", default=20, type=int, metavar="N", help="timed ops (20)")
    perf.add_argument("-w", "--warmup_iters", "--warmup-iters", dest="warmup_iters", default=5,
                      type=int, metavar="N", help="warm-up ops (5)")
    perf.add_argument("-c", "--check", default=1, type=int, metavar="N",
                      help="checked runs per size, 0 = no check (1)")
    perf.add_argument("-z", "--blocking", default=0, type=int, metavar="0/1",
                      help="wait for each op and barrier after it (0)")
    perf.add_argument("-a", "--average", default=1, type=int, metavar="0-3",
                      help="combine ranks' times: 0 rank 0, 1 mean, 2 min, 3 max (1)")
    perf.add_argument("-G", "--cudagraph", default=0, type=int, metavar="N",
                      help="capture the ops in a CUDA graph, replay N times (GPUs; 0)")
    job = p.add_argument_group("ranks")
    job.add_argument("--nproc", type=int, metavar="N", help="launch N local ranks")
    job.add_argument("--backend", default="auto", choices=["auto", "nccl", "gloo", "mpi", "ucc"],
                     help="auto: nccl with CUDA, else gloo")
    job.add_argument("--pairwise", action="store_true",
                     help="measure every pair's send/recv bandwidth (-e bytes) and latency")
    job.add_argument("--split", metavar="MODE", help=_SPLIT_HELP)
    job.add_argument("--slow-fraction", type=float, default=0.7, metavar="F",
                     help="flag pairs/groups below F x the median (0.7)")
    out = p.add_argument_group("output")
    out.add_argument("--json", metavar="FILE", help="write the results as JSON")
    out.add_argument("--csv", metavar="FILE", help="write the table as CSV")
    out.add_argument("--plot", metavar="FILE.png", help="plot busbw vs size (needs matplotlib)")
    p.set_defaults(func=run)


def options_from_args(args):
    """The validated `Options` for parsed arguments (raises UserError on bad input)."""
    from distdoctor.nccltest.ops import OP_NAMES
    from distdoctor.nccltest.options import (
        Options,
        parse_datatypes,
        parse_ops,
        parse_redops,
        parse_size,
        validate,
    )
    from distdoctor.nccltest.split import parse_split

    datatypes, explicit = parse_datatypes(args.datatype)
    redops, explicit_redops = parse_redops(args.op)
    root = args.root.strip().lower()
    if root != "all" and not root.lstrip("-").isdigit():
        raise UserError(f"-r/--root takes a rank number or all, not {args.root!r}", 2)
    if args.split:
        parse_split(args.split)
    opts = Options(
        ops=parse_ops(args.ops, OP_NAMES),
        minbytes=parse_size(args.minbytes, "-b/--minbytes"),
        maxbytes=parse_size(args.maxbytes, "-e/--maxbytes"),
        stepbytes=parse_size(args.stepbytes, "-i/--stepbytes"),
        stepfactor=args.stepfactor, iters=args.iters, warmup_iters=args.warmup_iters,
        check=args.check, datatypes=datatypes, explicit_datatypes=explicit,
        redops=redops, explicit_redops=explicit_redops, root=-1 if root == "all" else int(root),
        blocking=args.blocking, average=args.average, cudagraph=args.cudagraph,
        backend=args.backend, nproc=args.nproc, json_path=args.json, csv_path=args.csv,
        plot_path=args.plot, pairwise=args.pairwise, slow_fraction=args.slow_fraction,
        split=args.split)
    return validate(opts)


def _check_nccl() -> None:
    import torch
    import torch.distributed as dist
    if not (torch.cuda.is_available() and dist.is_nccl_available()):
        raise UserError("--backend nccl needs CUDA and a torch built with NCCL; "
                        "none here (use --backend gloo)")


def run(args) -> int:
    from distdoctor.nccltest import report

    opts = options_from_args(args)
    if opts.plot_path:
        report.require_matplotlib()
    under_launcher = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    if under_launcher and opts.nproc:
        raise UserError("--nproc starts ranks itself; under torchrun (RANK and WORLD_SIZE "
                        "are set) leave it out", 2)
    if opts.backend == "nccl" and not under_launcher:
        _check_nccl()
    if opts.nproc and not under_launcher:
        from distdoctor.nccltest.launch import launch
        return launch(opts, opts.nproc)
    from distdoctor.nccltest.worker import run_rank
    return run_rank(opts)
