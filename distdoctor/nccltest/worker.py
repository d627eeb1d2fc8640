"""One rank of `distdoctor nccl-test`: set up the process group, run, report on rank 0.

Started three ways: by `--nproc N` (options arrive as JSON in DISTDOCTOR_NCCLTEST_OPTIONS),
under torchrun (each rank runs the CLI, which calls `run_rank`), or alone (a world of one).
Errors a user caused end in one line: on rank 0 when every rank meets the same one (all
checks after the process group is up are made alike on every rank), else on the rank that
met it, prefixed with its number. Exit code: 0, or 1 when a check failed, a combination
could not run or a pair was slow.
"""

from __future__ import annotations

import os
import platform
import socket
import sys

from distdoctor.errors import UserError
from distdoctor.nccltest.options import Options
from distdoctor.safetext import printable

OPTIONS_ENV = "DISTDOCTOR_NCCLTEST_OPTIONS"
HOSTS_ENV = "DISTDOCTOR_TEST_HOSTS"  # test-only: "rank:host,..." stands in for other nodes
DEBUG_ENV = "DISTDOCTOR_DEBUG"


class RankError(UserError):
    """A UserError that only this rank met: printed by this rank, with its number."""


def _env_int(name: str, default: int) -> int:
    try:
        return int(os.environ.get(name, default))
    except ValueError:
        raise UserError(f"{name}={os.environ[name]!r} is not a number", 2) from None


def _host(rank: int) -> str:
    for part in os.environ.get(HOSTS_ENV, "").split(","):
        r, _, host = part.partition(":")
        if host and r.strip() == str(rank):
            return host.strip()
    return socket.gethostname()


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def _device(backend: str, local_rank: int):
    import torch
    if backend == "gloo" or not torch.cuda.is_available():
        if backend == "nccl":
            raise UserError("--backend nccl needs CUDA, and no GPU is visible; use gloo")
        return torch.device("cpu")
    count = torch.cuda.device_count()
    if local_rank >= count:
        raise RankError(f"LOCAL_RANK {local_rank} but only {count} GPU(s) are visible "
                        "on this host; launch at most one rank per GPU")
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


def _resolve_backend(requested: str) -> str:
    import torch
    import torch.distributed as dist
    if requested != "auto":
        return requested
    return "nccl" if torch.cuda.is_available() and dist.is_nccl_available() else "gloo"


def _rank_info(rank: int, local_rank: int, device):
    import torch

    from distdoctor.nccltest.peak import nvlink_peak, nvml_bus_id
    from distdoctor.nccltest.results import RankInfo
    info = RankInfo(rank, local_rank, _host(rank), os.getpid(), "cpu", _cpu_name(), "-")
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.device, info.device_name = f"cuda:{device.index}", props.name
        nums = [getattr(props, f"pci_{k}_id", None) for k in ("domain", "bus", "device")]
        if None not in nums:
            info.bus_id = nvml_bus_id(*nums)
        info.peak_gbps, info.peak_note = nvlink_peak(None if info.bus_id == "-"
                                                     else info.bus_id, device.index)
    return info


def _init(backend: str, device, single: bool) -> None:
    import torch.distributed as dist
    kwargs = {"device_id": device} if device.type == "cuda" else {}
    if single:  # no launcher: a world of one, no network
        kwargs.update(store=dist.HashStore(), rank=0, world_size=1)
    try:
        dist.init_process_group(backend, **kwargs)
    except (RuntimeError, ValueError) as exc:
        raise RankError(f"cannot start the {backend} process group: "
                        f"{str(exc).strip().splitlines()[0]}") from None


def _check_settings(opts: Options, backend: str, group_size: int) -> None:
    from distdoctor.nccltest.bench import UNSUPPORTED
    from distdoctor.nccltest.ops import OPS
    bad = [d for d in opts.datatypes if d in UNSUPPORTED.get(backend, ())]
    if bad and opts.explicit_datatypes:
        raise UserError(f"datatype {bad[0]} is not supported by the {backend} backend")
    rooted = [op for op in opts.ops if OPS[op].has_root]
    if rooted and opts.root >= group_size:
        raise UserError(f"-r {opts.root} is not a rank: {rooted[0]} runs on {group_size} "
                        f"rank(s) per group (roots 0..{group_size - 1})", 2)
    if opts.cudagraph and backend != "nccl":
        raise UserError("-G/--cudagraph needs CUDA and the nccl backend", 2)


def run_rank(opts: Options) -> int:
    """This rank's whole run; returns the exit code (errors already printed)."""
    rank = _env_int("RANK", 0)
    try:
        return _run(opts)
    except RankError as exc:
        print(f"distdoctor: error: rank {rank}: {printable(exc)}", file=sys.stderr)
        return exc.exit_code
    except UserError as exc:
        if rank == 0:
            print(f"distdoctor: error: {printable(exc)}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # e.g. a peer rank died mid-collective: say so, in one line
        if os.environ.get(DEBUG_ENV):
            raise
        lines = str(exc).strip().splitlines()
        print(f"distdoctor: error: rank {rank}: {type(exc).__name__}: "
              f"{printable(lines[0]) if lines else ''} (set {DEBUG_ENV}=1 for the traceback)",
              file=sys.stderr)
        return 1


def _run(opts: Options) -> int:
    import torch.distributed as dist
    single = "RANK" not in os.environ or "WORLD_SIZE" not in os.environ
    backend = _resolve_backend(opts.backend)
    device = _device(backend, _env_int("LOCAL_RANK", 0))
    _init(backend, device, single)
    try:
        return _sweep(opts, backend, device)
    finally:
        dist.destroy_process_group()


def _groups(opts: Options, infos):
    """(this rank's group handle, its index, every group's ranks), creating --split groups."""
    import torch.distributed as dist

    from distdoctor.nccltest.split import groups, parse_split
    world = dist.get_world_size()
    if not opts.split:
        return None, 0, [list(range(world))]
    members = groups(parse_split(opts.split), [i.host for i in infos])
    mine, handle = 0, None
    for index, ranks in enumerate(members):
        pg = dist.new_group(ranks) if len(members) > 1 else None  # every rank makes every group
        if dist.get_rank() in ranks:
            mine, handle = index, pg
    return handle, mine, members


def _sweep(opts: Options, backend: str, device) -> int:
    import torch.distributed as dist

    from distdoctor.nccltest import comm, report
    from distdoctor.nccltest.bench import Context, run_op
    from distdoctor.nccltest.results import RankInfo
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = _rank_info(rank, _env_int("LOCAL_RANK", 0), device)
    infos = [RankInfo.from_dict(d) for d in comm.gather_json(mine.to_dict(), device)]
    handle, index, members = _groups(opts, infos)
    for g, ranks in enumerate(members):
        for r in ranks:
            infos[r].group = g
    _check_settings(opts, backend, len(members[index]))
    ctx = Context(opts, rank, world, device, backend, handle, index, members)
    printer = Printer(rank == 0)
    printer.lines(report.header_lines(opts, infos, backend))
    if world == 1:
        printer.lines(["# 1 rank: pass --nproc N, or run under torchrun, to test links"])
    reports, pairwise = [], None
    if opts.pairwise:
        pairwise = _pairwise(opts, infos, device, printer)
    else:
        for op in opts.ops:
            printer.lines(report.op_title(op) + report.column_header())
            result = run_op(ctx, op, printer)
            result.notes = printer.take_notes()
            printer.lines(report.footer_lines(result, infos, opts))
            reports.append(result)
    comm.barrier(device)  # every rank is done with collectives before rank 0 writes
    if rank == 0:
        _write_outputs(opts, infos, backend, reports, pairwise)
    return 0 if report.outcome_ok(reports, pairwise) else 1


def _pairwise(opts: Options, infos, device, printer) -> dict:
    import torch.distributed as dist

    from distdoctor.nccltest import pairwise, pairwise_report
    if dist.get_world_size() < 2:
        raise UserError("--pairwise needs at least 2 ranks (--nproc 2 or more)", 2)
    bw, lat = pairwise.measure(device, opts.maxbytes, opts.iters, opts.warmup_iters,
                               pairwise.delays_from_env())
    result = pairwise_report.analyze(bw, lat, infos, opts.slow_fraction, opts.maxbytes,
                                     opts.iters)
    printer.lines(pairwise_report.format_lines(result, infos))
    return result


def _write_outputs(opts, infos, backend, reports, pairwise) -> None:
    import json

    from distdoctor.nccltest import report
    try:
        if opts.json_path:
            with open(opts.json_path, "w") as f:
                json.dump(report.to_json(opts, infos, backend, reports, pairwise), f, indent=1)
        if opts.csv_path and reports:
            with open(opts.csv_path, "w", newline="") as f:
                report.write_csv(reports, f)
        if opts.plot_path and reports:
            report.write_plot(reports, opts.plot_path,
                              f"distdoctor nccl-test, {len(infos)} ranks, {backend}")
    except OSError as exc:
        raise UserError(f"cannot write {exc.filename}: {exc.strerror}") from None


class Printer:
    """Prints rows and notes as they come, on rank 0 only; keeps the notes for JSON."""

    def __init__(self, active: bool):
        self.active = active
        self._notes: list[str] = []

    def lines(self, lines: list[str]) -> None:
        if self.active:
            from distdoctor.nccltest.report import print_lines
            print_lines(lines)

    def row(self, row) -> None:
        from distdoctor.nccltest.report import format_row
        self.lines([format_row(row)])

    def note(self, text: str) -> None:
        self._notes.append(text)
        self.lines([f"# {text}"])

    def take_notes(self) -> list[str]:
        notes, self._notes = self._notes, []
        return notes


def main() -> int:
    """Entry point of a rank launched by `--nproc` (see `distdoctor.nccltest.launch`)."""
    try:
        opts = Options.from_json(os.environ[OPTIONS_ENV])
    except (KeyError, ValueError, TypeError):
        print(f"distdoctor: error: {OPTIONS_ENV} is missing or malformed; run "
              "`distdoctor nccl-test` rather than this module", file=sys.stderr)
        return 2
    return run_rank(opts)


if __name__ == "__main__":
    sys.exit(main())
