"""The per-rank sweep: nccl-tests' BenchTime, one op at a time, on every rank in lockstep.

Per (dtype, redop, root): one probe op (a backend that rejects the combination says so
here, on every rank alike), then `-w` warm-up iterations at the largest and the smallest
size. Per size and place: allocate (every rank agrees on out-of-memory before anyone
enters a collective), one synchronising op, a barrier, `-n` ops issued back to back and
waited for together (each waited for and followed by a barrier with `-z 1`; replayed from a
CUDA graph `-G` times on GPUs), then `-c` checked runs with fresh inputs. Every rank's mean
time per op is shared once per row and combined as `-a` says.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from distdoctor.nccltest import comm
from distdoctor.nccltest.collectives import Call, Prepared, build
from distdoctor.nccltest.ops import OPS, OpSpec, bandwidths, layout
from distdoctor.nccltest.options import DTYPES, Options
from distdoctor.nccltest.results import GroupResult, OpReport, PlaceResult, Row, combine
from distdoctor.nccltest.verify import count_wrong, tolerance

TIMING_SEED = 99  # nccl-tests initialises the timed buffers with seed 99 too
UNSUPPORTED = {"gloo": {"uint32", "uint64"}}  # torch's gloo rejects these dtypes


@dataclass
class Context:
    """Where this rank stands: its group (the world, or its --split group) and settings."""

    opts: Options
    rank: int
    world: int
    device: torch.device
    backend: str
    group: Any  # ProcessGroup of this rank's group; None = the default (world) group
    group_index: int
    groups: list[list[int]]  # every group's global ranks, by group index

    @property
    def group_ranks(self) -> list[int]:
        return self.groups[self.group_index]

    @property
    def group_rank(self) -> int:
        return self.group_ranks.index(self.rank)

    @property
    def group_size(self) -> int:
        return len(self.group_ranks)


class Emitter:
    """Receives rows and notes as they are made; the printer on rank 0 overrides it."""

    def row(self, row: Row) -> None:  # pragma: no cover - overridden
        pass

    def note(self, text: str) -> None:  # pragma: no cover - overridden
        pass


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:200]


def _is_oom(exc: BaseException) -> bool:
    if isinstance(exc, (MemoryError, getattr(torch, "OutOfMemoryError", MemoryError))):
        return True
    msg = str(exc).lower()
    return "out of memory" in msg or "can't allocate memory" in msg


def _free(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _alloc(ctx: Context, call: Call) -> tuple[Prepared | None, str]:
    """Build and initialise buffers; all ranks agree to skip if any rank failed."""
    prep, err = None, ""
    try:
        prep = build(call)
        prep.init(TIMING_SEED)
    except Exception as exc:  # noqa: BLE001 - reported, and the size is skipped everywhere
        prep = None
        err = "out of memory" if _is_oom(exc) else _one_line(exc)
    if comm.any_rank(prep is None, ctx.device):
        del prep
        _free(ctx.device)
        return None, err or "failed on another rank"
    return prep, ""


def _time_graph(ctx: Context, prep: Prepared) -> float:
    """-G: capture -n ops in a CUDA graph, replay it -G times, mean time per op."""
    dev, opts = ctx.device, ctx.opts
    stream = torch.cuda.Stream(device=dev)
    stream.wait_stream(torch.cuda.current_stream(dev))
    graph = torch.cuda.CUDAGraph()
    # thread_local: the NCCL watchdog thread queries events while we capture.
    with torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
        for _ in range(opts.iters):
            for work in prep.issue():
                work.wait()
    torch.cuda.current_stream(dev).wait_stream(stream)
    comm.barrier(dev)
    start = time.perf_counter()
    for _ in range(opts.cudagraph):
        graph.replay()
    comm.device_sync(dev)
    return (time.perf_counter() - start) / (opts.iters * opts.cudagraph)


def _time(ctx: Context, prep: Prepared) -> float:
    """Mean seconds per op on this rank, timed as nccl-tests does."""
    dev, opts = ctx.device, ctx.opts
    comm.complete(prep.issue(), dev)  # one op to synchronise
    comm.barrier(dev)  # all groups start together, as nccl-tests' world-wide Barrier
    if opts.cudagraph and dev.type == "cuda":
        return _time_graph(ctx, prep)
    start = time.perf_counter()
    if opts.blocking:
        for _ in range(opts.iters):
            comm.complete(prep.issue(), dev)
            comm.barrier(dev)
    else:
        works: list = []
        for _ in range(opts.iters):
            works.extend(prep.issue())
        comm.complete(works, dev)
    return (time.perf_counter() - start) / opts.iters


def _check(ctx: Context, prep: Prepared, redop: str, dtype: str) -> int:
    """Run -c times on fresh inputs; count this rank's wrong elements."""
    if prep.result is None:  # e.g. a non-root rank of reduce: nothing lands here
        for check in range(ctx.opts.check):
            prep.init(check + 1)
            comm.complete(prep.issue(), ctx.device)
        return 0
    rtol, atol = tolerance(redop, dtype, ctx.group_size)
    wrong = 0
    for check in range(ctx.opts.check):
        seed = check + 1
        prep.init(seed)
        comm.complete(prep.issue(), ctx.device)
        wrong += count_wrong(prep.result, prep.expect(seed), rtol, atol)
    return wrong


@dataclass
class Combo:
    spec: OpSpec
    dtype: str
    redop: str
    root: int

    @property
    def label(self) -> str:
        parts = [self.spec.name, self.dtype]
        if self.redop != "none":
            parts.append(self.redop)
        if self.root >= 0:
            parts.append(f"root {self.root}")
        return " ".join(parts)


def _call(ctx: Context, combo: Combo, size: int, place: str) -> Call:
    lay = layout(combo.spec, size, DTYPES[combo.dtype][1], ctx.group_size)
    return Call(combo.spec.name, place, lay, combo.dtype, combo.redop, combo.root,
                ctx.group_rank, ctx.group, ctx.group_ranks, ctx.device)


def _places(spec: OpSpec) -> list[str]:
    return [p for p, ok in (("oop", spec.out_of_place), ("ip", spec.in_place)) if ok]


def _warm_up(ctx: Context, combo: Combo, report: OpReport, emit: Emitter) -> bool:
    """Probe once at the smallest runnable size, then -w ops at the largest and smallest."""
    sizes = [s for s in ctx.opts.sizes if _call(ctx, combo, s, "oop").lay.count > 0]
    if not sizes:
        return True  # every size is skipped with a note by the sweep
    place = _places(combo.spec)[0]
    for size in dict.fromkeys([min(sizes), max(sizes)]):
        prep, _ = _alloc(ctx, _call(ctx, combo, size, place))
        if prep is None:
            continue  # the sweep reports the size it cannot allocate
        err = ""
        try:
            if size == min(sizes):
                comm.complete(prep.issue(), ctx.device)  # the probe
            works: list = []
            for _ in range(ctx.opts.warmup_iters):
                works.extend(prep.issue())
            comm.complete(works, ctx.device)
        except Exception as exc:  # noqa: BLE001 - e.g. a dtype or redop the backend rejects
            err = _one_line(exc)
        del prep
        if comm.any_rank(bool(err), ctx.device):
            # A combination asked for by name must run; one from `-d all`/`-o all` may not.
            if ctx.opts.explicit_datatypes and ctx.opts.explicit_redops:
                report.errors += 1
            emit.note(f"{combo.label}: skipped, the {ctx.backend} backend refused it "
                      f"({err or 'on another rank'})")
            return False
    return True


def _place_result(ctx: Context, combo: Combo, lay, times: list[float],
                  wrongs: list[float] | None) -> PlaceResult:
    opts = ctx.opts
    seconds = combine(times, opts.average)
    algbw, busbw = bandwidths(combo.spec, lay, seconds)
    groups = []
    if len(ctx.groups) > 1:
        for index, ranks in enumerate(ctx.groups):
            g_seconds = combine([times[r] for r in ranks], opts.average)
            g_alg, g_bus = bandwidths(combo.spec, lay, g_seconds)
            groups.append(GroupResult(index, ranks, g_seconds * 1e6, g_alg, g_bus))
    wrong = int(sum(wrongs)) if wrongs is not None else None
    return PlaceResult(seconds * 1e6, algbw, busbw, wrong, [t * 1e6 for t in times], groups)


def _measure(ctx: Context, combo: Combo, size: int, emit: Emitter,
             report: OpReport) -> Row | None:
    spec, opts = combo.spec, ctx.opts
    local: dict[str, tuple[float, int]] = {}
    lay = None
    for place in _places(spec):
        call = _call(ctx, combo, size, place)
        lay = call.lay
        prep, err = _alloc(ctx, call)
        if prep is None:
            if err != "out of memory":
                report.errors += 1
            emit.note(f"{combo.label}: skipping {size} B: {err}")
            return None
        seconds = _time(ctx, prep)
        wrong = _check(ctx, prep, combo.redop, combo.dtype) if opts.check else 0
        local[place] = (seconds, wrong)
        del prep
        _free(ctx.device)
    values = [local.get(p, (0.0, 0))[i] for i in (0, 1) for p in ("oop", "ip")]
    table = comm.gather_floats(values, ctx.device)  # per rank: t_oop, t_ip, w_oop, w_ip
    results: dict[str, PlaceResult | None] = {}
    for column, place in enumerate(("oop", "ip")):
        if place not in local:
            results[place] = None
            continue
        times = [row[column] for row in table]
        wrongs = [row[2 + column] for row in table] if opts.check else None
        results[place] = _place_result(ctx, combo, lay, times, wrongs)
    return Row(spec.name, lay.size, lay.count, combo.dtype, combo.redop, combo.root,
               ctx.group_size, results["oop"], results["ip"])


def run_op(ctx: Context, op: str, emit: Emitter) -> OpReport:
    """Sweep one op over every dtype, redop, root and size; rows go to `emit` as made."""
    spec, opts, report = OPS[op], ctx.opts, OpReport(op)
    n = ctx.group_size
    if n < spec.min_ranks:
        emit.note(f"{op}: skipped, it needs at least {spec.min_ranks} ranks per group "
                  f"(this group has {n})")
        return report
    roots = ([*range(n)] if opts.root == -1 else [opts.root]) if spec.has_root else [-1]
    redops = opts.redops if spec.has_redop else ["none"]
    for dtype in opts.datatypes:
        if dtype in UNSUPPORTED.get(ctx.backend, ()):
            emit.note(f"{op} {dtype}: skipped, the {ctx.backend} backend has no {dtype}")
            continue
        for redop in redops:
            for root in roots:
                combo = Combo(spec, dtype, redop, root)
                if not _warm_up(ctx, combo, report, emit):
                    continue
                sizes = [s for s in opts.sizes if _call(ctx, combo, s, "oop").lay.count > 0]
                too_small = [s for s in opts.sizes if s not in sizes]
                if too_small:
                    why = (f"under 16 B per rank once split over {n} ranks" if spec.divided
                           else f"smaller than one {dtype} element")
                    emit.note(f"{combo.label}: skipped {', '.join(map(str, too_small))} B: "
                              f"{why}")
                for size in sizes:
                    row = _measure(ctx, combo, size, emit, report)
                    if row is not None:
                        report.rows.append(row)
                        emit.row(row)
    return report
