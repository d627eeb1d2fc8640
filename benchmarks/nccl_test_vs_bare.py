"""busbw of `distdoctor nccl-test`'s timing loop vs a bare torch.distributed loop, one run.

    python benchmarks/nccl_test_vs_bare.py [--reps 7] [--iters 20] [--sizes 1M,4M,16M]
                                           [--ops all_reduce,all_gather,...]

Starts 2 local ranks on gloo (CPU). For each op and size (>= 1 MiB) it alternates, `--reps`
times, the harness's own measurement (bench._measure: allocate, sync op, barrier, -n ops
back to back, wait; mean over ranks) and a bare loop written directly against
torch.distributed (warm-up, barrier, the same -n async ops, wait, mean over ranks), then
prints the median busbw of each and their ratio, and the best (highest) of each and their
ratio: on a shared machine other work only ever slows a run down, so the best runs show the
harness's own cost most clearly. Interleaving keeps slow drift out of both. A ratio of 1.00
means the harness adds nothing measurable.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

CHILD_FLAG = "--rank-child"
OPS = ["all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "sendrecv"]


def _bare_issue(op: str, nbytes: int, rank: int, n: int):
    """Buffers and a closure that starts the op the plainest way torch.distributed allows."""
    import torch
    import torch.distributed as dist
    count = nbytes // 4
    chunk = (count // n) // 4 * 4  # the harness's 16-byte-aligned per-rank chunk
    if op == "all_reduce":
        buf = torch.ones(count)
        return lambda: [dist.all_reduce(buf, async_op=True)]
    if op == "all_gather":
        out, inp = torch.empty(chunk * n), torch.ones(chunk)
        return lambda: [dist.all_gather_single(out, inp, async_op=True)]
    if op == "reduce_scatter":
        out, inp = torch.empty(chunk), torch.ones(chunk * n)
        return lambda: [dist.reduce_scatter_single(out, inp, async_op=True)]
    if op == "broadcast":
        buf = torch.ones(count)
        return lambda: [dist.broadcast(buf, src=0, async_op=True)]
    if op == "all_to_all":
        out, inp = torch.empty(chunk * n), torch.ones(chunk * n)
        return lambda: [dist.all_to_all_single(out, inp, async_op=True)]
    send, recv = torch.ones(count), torch.empty(count)
    ops = [dist.P2POp(dist.isend, send, (rank + 1) % n), dist.P2POp(dist.irecv, recv, (rank - 1) % n)]
    return lambda: dist.batch_isend_irecv(ops)


def _bare_busbw(op: str, nbytes: int, iters: int, warmup: int) -> float:
    import torch
    import torch.distributed as dist

    from distdoctor.nccltest.ops import OPS as SPECS
    from distdoctor.nccltest.ops import bandwidths, layout
    rank, n = dist.get_rank(), dist.get_world_size()
    issue = _bare_issue(op, nbytes, rank, n)
    works = [w for _ in range(warmup) for w in issue()]
    for w in works:
        w.wait()
    dist.barrier()
    start = time.perf_counter()
    works = [w for _ in range(iters) for w in issue()]
    for w in works:
        w.wait()
    seconds = torch.tensor([(time.perf_counter() - start) / iters], dtype=torch.float64)
    dist.all_reduce(seconds)
    lay = layout(SPECS[op], nbytes, 4, n)
    return bandwidths(SPECS[op], lay, seconds.item() / n)[1]


def _harness_busbw(ctx, op: str, nbytes: int) -> float:
    from distdoctor.nccltest.bench import Combo, Emitter, _measure
    from distdoctor.nccltest.ops import OPS as SPECS
    from distdoctor.nccltest.results import OpReport
    spec = SPECS[op]
    combo = Combo(spec, "float", "sum" if spec.has_redop else "none", 0 if spec.has_root else -1)
    row = _measure(ctx, combo, nbytes, Emitter(), OpReport(op))
    place = row.oop if row.oop is not None else row.ip  # the form the bare loop uses
    return place.busbw


def child(reps: int, iters: int, sizes: list[int], ops: list[str]) -> int:
    import torch
    import torch.distributed as dist

    from distdoctor.nccltest.bench import Context
    from distdoctor.nccltest.options import Options
    dist.init_process_group("gloo")
    rank, n = dist.get_rank(), dist.get_world_size()
    opts = Options(iters=iters, warmup_iters=5, check=0, average=1)
    ctx = Context(opts, rank, n, torch.device("cpu"), "gloo", None, 0, [list(range(n))])
    if rank == 0:
        print(f"# harness vs bare torch.distributed, gloo, {n} ranks, {iters} iters, "
              f"median of {reps} interleaved runs; busbw in GB/s (GB = 1e9)")
        print(f"{'op':>15s} {'size':>10s} {'harness':>9s} {'bare':>9s} {'ratio':>7s} "
              f"{'best h':>9s} {'best b':>9s} {'ratio':>7s}")
    ratios, best_ratios = [], []
    for op in ops:
        for nbytes in sizes:
            harness, bare = [], []
            for rep in range(reps):
                order = ("h", "b") if rep % 2 == 0 else ("b", "h")
                for which in order:
                    if which == "h":
                        harness.append(_harness_busbw(ctx, op, nbytes))
                    else:
                        bare.append(_bare_busbw(op, nbytes, iters, opts.warmup_iters))
            h, b = statistics.median(harness), statistics.median(bare)
            hb, bb = max(harness), max(bare)
            ratios.append(h / b)
            best_ratios.append(hb / bb)
            if rank == 0:
                print(f"{op:>15s} {nbytes:10d} {h:9.3f} {b:9.3f} {h / b:7.3f} {hb:9.3f} "
                      f"{bb:9.3f} {hb / bb:7.3f}", flush=True)
    if rank == 0:
        for name, values in (("median", ratios), ("best", best_ratios)):
            print(f"# {name}: geometric mean ratio {statistics.geometric_mean(values):.3f}, "
                  f"min {min(values):.3f}, max {max(values):.3f}")
    dist.destroy_process_group()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--sizes", default="1M,4M,16M")
    parser.add_argument("--ops", default=",".join(OPS))
    parser.add_argument(CHILD_FLAG, action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    from distdoctor.nccltest.options import Options, parse_size
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    if min(sizes) < 1 << 20:
        parser.error("the comparison is for sizes of 1M and above")
    if args.rank_child:
        return child(args.reps, args.iters, sizes, args.ops.split(","))
    from distdoctor.nccltest.launch import launch
    cmd = [sys.executable, os.path.abspath(__file__), CHILD_FLAG, "--reps", str(args.reps),
           "--iters", str(args.iters), "--sizes", args.sizes, "--ops", args.ops]
    return launch(Options(), 2, command=cmd)


if __name__ == "__main__":
    sys.exit(main())
