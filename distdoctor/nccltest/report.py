"""nccl-tests' table, column for column, and its JSON, CSV and PNG twins. No torch here.

The widths are nccl-tests' (`%12li  %12li  %8s  %6s  %6i`, then `%7s  %6.2f  %6.2f  %5s` per
place), so a line can be compared with an `all_reduce_perf` line by eye or by script.
"""

from __future__ import annotations

import csv
import json
import statistics
import sys
from typing import TextIO

from distdoctor.errors import UserError
from distdoctor.nccltest.ops import OPS
from distdoctor.nccltest.options import AVERAGE_NAMES, Options
from distdoctor.nccltest.results import OpReport, PlaceResult, RankInfo, Row
from distdoctor.safetext import printable

JSON_FORMAT = "distdoctor.nccl-test"
JSON_VERSION = 1


def time_str(time_us: float) -> str:
    """nccl-tests' time column: fewer decimals as the time grows."""
    if time_us >= 10000.0:
        return f"{time_us:7.0f}"
    if time_us >= 100.0:
        return f"{time_us:7.1f}"
    return f"{time_us:7.2f}"


def column_header() -> list[str]:
    blank = ("", "", "", "", "")
    return [
        "# {:>10s}  {:>12s}  {:>8s}  {:>6s}  {:>6s}".format(*blank)
        + "           out-of-place                       in-place          ",
        "# {:>10s}  {:>12s}  {:>8s}  {:>6s}  {:>6s}  {:>7s}  {:>6s}  {:>6s} {:>6s}  {:>7s}  "
        "{:>6s}  {:>6s} {:>6s}".format("size", "count", "type", "redop", "root", "time",
                                       "algbw", "busbw", "#wrong", "time", "algbw", "busbw",
                                       "#wrong"),
        "# {:>10s}  {:>12s}  {:>8s}  {:>6s}  {:>6s}  {:>7s}  {:>6s}  {:>6s}  {:>5s}  {:>7s}  "
        "{:>6s}  {:>6s}  {:>5s}".format("(B)", "(elements)", "", "", "", "(us)", "(GB/s)",
                                        "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", ""),
    ]


def _place(place: PlaceResult | None) -> str:
    if place is None:
        return "  {:>7s}  {:>6s}  {:>6s}  {:>5s}".format("N/A", "N/A", "N/A", "N/A")
    wrong = "N/A" if place.wrong is None else f"{place.wrong:g}"
    return f"  {time_str(place.time_us)}  {place.algbw:6.2f}  {place.busbw:6.2f}  {wrong:>5s}"


def format_row(row: Row) -> str:
    return (f"{row.size:12d}  {row.count:12d}  {row.dtype:>8s}  {row.redop:>6s}  {row.root:6d}"
            + _place(row.oop) + _place(row.ip))


def header_lines(opts: Options, ranks: list[RankInfo], backend: str) -> list[str]:
    step = (f"{opts.stepfactor}(factor)" if opts.stepfactor > 1 else f"{opts.stepbytes}(bytes)")
    groups = len({r.group for r in ranks})
    lines = ["# distdoctor nccl-test (nccl-tests conventions: GB = 1e9, busbw = algbw x op "
             "factor)"]
    if opts.pairwise:
        lines.append(f"# nRanks {len(ranks)} backend {backend} pairwise: {opts.maxbytes} B "
                     f"messages, warmup iters: {opts.warmup_iters} iters: {opts.iters}, "
                     f"slow below {opts.slow_fraction:g} x median")
    else:
        lines += [
            f"# nRanks {len(ranks)} backend {backend} minBytes {opts.minbytes} maxBytes "
            f"{opts.maxbytes} step: {step} warmup iters: {opts.warmup_iters} iters: "
            f"{opts.iters} validation: {opts.check} graph: {opts.cudagraph}",
            f"# blocking: {opts.blocking} average: {opts.average} "
            f"({AVERAGE_NAMES[opts.average]} over ranks)"
            + (f" split: {opts.split} ({groups} groups)" if opts.split else "")]
    lines += ["#", "# Using devices"]
    for r in ranks:
        lines.append(f"#  Rank {r.rank:2d} Group {r.group:2d} Pid {r.pid:6d} on {r.host:>10s} "
                     f"device {r.device:>6s} [{r.bus_id}] {r.device_name}")
    peaks = {(r.host, r.peak_gbps, r.peak_note) for r in ranks if r.peak_gbps}
    for host, peak, note in sorted(peaks, key=str):
        lines.append(f"#  NVLink peak on {host}: {peak:g} GB/s per GPU per direction ({note})")
    lines.append("#")
    return lines


def op_title(op: str) -> list[str]:
    spec = OPS[op]
    lines = [f"# Collective test: {op}"]
    if not spec.out_of_place:
        lines.append("#  out-of-place: N/A, torch.distributed has only the in-place form")
    if not spec.in_place:
        lines.append("#  in-place: N/A, the op has no in-place form (nccl-tests times a race)")
    return lines + ["#"]


def footer_lines(report: OpReport, ranks: list[RankInfo], opts: Options) -> list[str]:
    oob = report.out_of_bounds
    lines = [f"# Out of bounds values : {oob} {'FAILED' if oob else 'OK'}",
             f"# Avg bus bandwidth    : {report.avg_busbw:g} "]
    if report.errors:
        lines.append(f"# Could not run        : {report.errors} (see the notes above) FAILED")
    peak = shared_peak(ranks)
    if peak and report.rows:
        lines.append(f"# NVLink peak          : {peak:g} GB/s; avg bus bandwidth is "
                     f"{100.0 * report.avg_busbw / peak:.0f}% of it")
    lines += split_lines(report, ranks, opts)
    return lines + ["#"]


def shared_peak(ranks: list[RankInfo]) -> float | None:
    """The NVLink peak when every rank sits on one host and NVML told it for each GPU."""
    if not ranks or len({r.host for r in ranks}) != 1:
        return None
    peaks = [r.peak_gbps for r in ranks]
    return min(peaks) if all(peaks) else None


def slow_groups(report: OpReport, fraction: float) -> dict[int, float]:
    """Groups whose average busbw is below `fraction` x the median group: {group: ratio}."""
    avg = report.group_avg_busbw()
    if len(avg) < 3:  # with two groups there is no majority to call one of them slow
        return {}
    median = statistics.median(avg.values())
    return {g: v / median for g, v in avg.items() if median > 0 and v < fraction * median}


def split_lines(report: OpReport, ranks: list[RankInfo], opts: Options) -> list[str]:
    avg = report.group_avg_busbw()
    if len(avg) < 2:
        return []
    slow = slow_groups(report, opts.slow_fraction)
    lines = ["# Split groups (avg bus bandwidth over the sweep):"]
    for g, value in avg.items():
        members = [r for r in ranks if r.group == g]
        hosts = ",".join(dict.fromkeys(r.host for r in members))
        flag = f"  SLOW: {100 * slow[g]:.0f}% of the median group" if g in slow else ""
        lines.append(f"#  Group {g:2d} ranks {','.join(str(r.rank) for r in members)} on "
                     f"{hosts}: {value:g} GB/s{flag}")
    return lines


# --- machine-readable twins -------------------------------------------------------------

def _place_json(place: PlaceResult | None) -> dict | None:
    if place is None:
        return None
    out = {"time_us": place.time_us, "algbw_gbps": place.algbw, "busbw_gbps": place.busbw,
           "wrong": place.wrong, "rank_time_us": place.rank_time_us}
    if place.groups:
        out["groups"] = [{"group": g.group, "ranks": g.ranks, "time_us": g.time_us,
                          "algbw_gbps": g.algbw, "busbw_gbps": g.busbw} for g in place.groups]
    return out


def to_json(opts: Options, ranks: list[RankInfo], backend: str, reports: list[OpReport],
            pairwise: dict | None = None) -> dict:
    tests = []
    for rep in reports:
        nranks = rep.rows[0].nranks if rep.rows else None
        tests.append({
            "op": rep.op, "nranks": nranks,
            "busbw_factor": OPS[rep.op].busbw_factor(nranks) if nranks else None,
            "out_of_bounds": rep.out_of_bounds, "errors": rep.errors,
            "avg_busbw_gbps": rep.avg_busbw, "notes": rep.notes,
            "group_avg_busbw_gbps": {str(g): v for g, v in rep.group_avg_busbw().items()},
            "slow_groups": {str(g): r for g, r in slow_groups(rep, opts.slow_fraction).items()},
            "results": [{"size": row.size, "count": row.count, "type": row.dtype,
                         "redop": row.redop, "root": row.root, "nranks": row.nranks,
                         "out_of_place": _place_json(row.oop), "in_place": _place_json(row.ip)}
                        for row in rep.rows]})
    return {"format": JSON_FORMAT, "version": JSON_VERSION, "backend": backend,
            "world_size": len(ranks), "options": json.loads(opts.to_json()),
            "ranks": [r.to_dict() for r in ranks], "peak_gbps": shared_peak(ranks),
            "tests": tests, "pairwise": pairwise, "ok": outcome_ok(reports, pairwise)}


def outcome_ok(reports: list[OpReport], pairwise: dict | None) -> bool:
    if any(rep.out_of_bounds or rep.errors for rep in reports):
        return False
    return not (pairwise and (pairwise.get("slow_pairs") or pairwise.get("slow_latency")))


CSV_COLUMNS = ["op", "size", "count", "type", "redop", "root", "nranks",
               "oop_time_us", "oop_algbw_gbps", "oop_busbw_gbps", "oop_wrong",
               "ip_time_us", "ip_algbw_gbps", "ip_busbw_gbps", "ip_wrong"]


def write_csv(reports: list[OpReport], file: TextIO) -> None:
    writer = csv.writer(file)
    writer.writerow(CSV_COLUMNS)
    for rep in reports:
        for row in rep.rows:
            cells = [row.op, row.size, row.count, row.dtype, row.redop, row.root, row.nranks]
            for place in (row.oop, row.ip):
                if place is None:
                    cells += ["", "", "", ""]
                else:
                    cells += [f"{place.time_us:.3f}", f"{place.algbw:.4f}",
                              f"{place.busbw:.4f}", "" if place.wrong is None else place.wrong]
            writer.writerow(cells)


def require_matplotlib() -> None:
    """--plot needs matplotlib, which distdoctor does not depend on: say so up front."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise UserError("--plot needs matplotlib, which is not installed "
                        "(pip install matplotlib), or leave out --plot") from None


def write_plot(reports: list[OpReport], path: str, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for rep in reports:
        for place, style in (("oop", "-"), ("ip", "--")):
            points = [(row.size, getattr(row, place).busbw) for row in rep.rows
                      if getattr(row, place) is not None]
            if points:
                xs = [x for x, _ in points]
                ys = [y for _, y in points]
                label = f"{rep.op} ({'out-of-place' if place == 'oop' else 'in-place'})"
                ax.plot(xs, ys, style, marker="o", markersize=3, label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("size (bytes)")
    ax.set_ylabel("busbw (GB/s, GB = 1e9)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def print_lines(lines: list[str], file: TextIO | None = None) -> None:
    out = file or sys.stdout
    for line in lines:  # hosts and device names are what the other ranks said
        print(printable(line), file=out)
    out.flush()
