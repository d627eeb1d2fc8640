"""A run as PyTorch Flight Recorder dumps: one file per rank, in the format torch 2.13's
recorder writes (format "2.10"), so the tools a runbook already names read a distdoctor
run dir: `python -m torch.distributed.flight_recorder.fr_trace DIR` (torchfrtrace), with no
flags, and `distdoctor diagnose --fr-dump DIR`.

What each entry holds, and where it comes from:
- record_id: the op's number on its rank (from 0; from the first event kept when the
  rank's ring wrapped, so a reader sees the oldest entries are gone);
- process_group (name, desc), pg_id, and pg_config's ranks: the traced group;
- collective_seq_id: the group's sequence number + 1 (the recorder counts from 1); a p2p
  op carries the group's last one, as NCCL's recorder does; p2p_seq_id counts the group's
  p2p ops (a batch of p2p ops issued together counts once, closed by a "coalesced" entry,
  as NCCL records batch_isend_irecv);
- profiling_name: "<backend>:<op>", the op named as that backend's recorder names it
  (`_GLOO`, `_NCCL`); sizes, dtypes: the traced tensors, laid out as the recorder lays
  them out (an all_gather's output is [group size, *input]);
- state: "completed" when the op returned, "started" while it was in flight or when it
  failed (retired then, as the recorder retires an op that timed out);
  time_discovered_started_ns / completed_ns: when the call was entered / returned, and
  duration_ms; every time is wall clock (each rank's monotonic clock moved by its anchors);
- frames: the user's call site, then up to three user frames that called it (pickle; the
  JSON variant has no frames, as torch's); thread_name / thread_id: the user thread that
  issued the op where it was not the main thread ("MainThread" otherwise).
What it cannot hold: the full stack, the group's timeout (torch's default for the backend
is written), NCCL's communicator state.
"""

from __future__ import annotations

import json
import os
import pickle
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from distdoctor.diagnosis.flight_recorder.dumps import _DTYPES
from distdoctor.errors import UserError
from distdoctor.export.clock import Clock

FR_VERSION = "2.10"  # the format torch 2.13's recorder writes
FILE_PREFIX = "nccl_trace_rank_"  # torch's default dump name (TORCH_FR_DUMP_TEMP_FILE)
FORMATS = ("pickle", "json")
_OUR_FILE = re.compile(re.escape(FILE_PREFIX) + r"\d+(\.json)?")
# the group timeout torch uses when none is given; distdoctor does not record it
_TIMEOUT_MS = {"nccl": 600_000, "gloo": 1_800_000}
# the prefixes torch 2.15's analyzer knows (flight_recorder/components/types.py, `Op`);
# its format is still "2.10" there (FlightRecorder.hpp, version_val)
_BACKENDS = ("nccl", "ncclx", "nccl2", "nccl-lazy", "xccl", "gloo", "rccl", "rcclx", "mccl",
             "hccl")

# our op -> the name NCCL's recorder gives it (ProcessGroupNCCL's profiling titles)
_NCCL = {
    "all_reduce": "all_reduce", "all_reduce_coalesced": "allreduce_coalesced",
    "broadcast": "broadcast", "reduce": "reduce", "all_gather": "all_gather",
    "all_gather_into_tensor": "_all_gather_base",
    "all_gather_into_tensor_coalesced": "all_gather_into_tensor_coalesced",
    "all_gather_coalesced": "ALLGATHER_coalesced", "reduce_scatter": "reduce_scatter",
    "reduce_scatter_tensor": "_reduce_scatter_base",
    "reduce_scatter_tensor_coalesced": "reduce_scatter_tensor_coalesced",
    "all_to_all": "all_to_all", "all_to_all_single": "all_to_all", "gather": "gather",
    "gather_into_tensor": "gather", "scatter": "scatter", "barrier": "all_reduce_barrier",
    "monitored_barrier": "barrier", "send": "send", "recv": "recv",
}
# gloo's recorder (torch 2.13) names some ops after how gloo runs them: checked one by
# one against its own dumps in tests/test_flight_recorder_export.py. Ops it splits into
# several entries (reduce_scatter, the *_coalesced tensor ops) or does not record (p2p)
# keep one entry under NCCL's name: the analyzer knows those names.
_GLOO = dict(_NCCL, all_reduce_coalesced="all_reduce", all_gather_into_tensor="all_gather",
             reduce_scatter_tensor="all_reduce", all_to_all_single="all_to_all",
             barrier="barrier")


@dataclass
class FrExportStats:
    ranks: int = 0
    entries: int = 0
    files: list[Path] = field(default_factory=list)
    left_out: dict[str, int] = field(default_factory=dict)  # op -> count the format cannot hold


def _backend(meta: dict, device: str) -> str:
    """The recorder's prefix for an op: the run's backend where the analyzer knows it,
    else NCCL for a CUDA tensor and gloo for the rest (a "cpu:gloo,cuda:nccl" group)."""
    name = str(meta.get("backend") or "").lower()
    if name in _BACKENDS:
        return name
    return "nccl" if device.startswith("cuda") else "gloo"


def _c10_dtype(name: str) -> str:
    return _C10.get(name) or (name[:1].upper() + name[1:])


_C10 = {torch_name: c10 for c10, torch_name in _DTYPES.items()}


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _split(shape: list, n: int) -> list:
    """One rank's part of a tensor split along dim 0 (reduce_scatter's output)."""
    if shape and n and shape[0] % n == 0:
        return [shape[0] // n, *shape[1:]]
    return [_numel(shape) // max(n, 1)]


def _layout(ev, name: str, n: int) -> tuple[list, list, list, list]:
    """(input sizes, output sizes, input dtypes, output dtypes) as the recorder lays out
    the op's tensors. The log holds each tensor's shape and the output's element count;
    where an output shape is not known, one with that count is written."""
    shapes = [list(s) for s in ev.shapes]
    dtypes = [_c10_dtype(str(d)) for d in ev.dtypes]
    first = shapes[0] if shapes else []
    d0 = dtypes[:1]
    op = ev.op
    if op in ("send", "recv"):
        return shapes[:1], shapes[:1], d0, d0
    if op in ("all_gather", "all_gather_into_tensor", "gather", "gather_into_tensor"):
        out = [[n * first[0], *first[1:]]] if name == "_all_gather_base" and first \
            else [[n, *first]]
        if ev.numel_out == 0:  # gather on a rank that is not the root
            return shapes[:1], [], d0, []
        return shapes[:1], out if _numel(out[0]) == ev.numel_out else [[ev.numel_out]], d0, d0
    if op == "scatter":
        if ev.numel_in == 0:  # not the root: only an output
            return [], shapes[:1], [], d0
        return [[len(shapes), *first]], [first], d0, d0
    if op == "reduce_scatter":  # a list of group-size inputs, stacked as NCCL flattens it
        return [[len(shapes), *first]], [first], d0, d0
    if op == "reduce_scatter_tensor" and name != "all_reduce":
        return [first], [_split(first, n)], d0, d0
    if op == "reduce_scatter_tensor_coalesced":
        return shapes, [_split(s, n) for s in shapes], dtypes, dtypes
    if op == "all_gather_into_tensor_coalesced":
        return shapes, [[n * s[0], *s[1:]] if s else [n] for s in shapes], dtypes, dtypes
    if op in ("all_to_all", "all_to_all_single", "all_gather_coalesced"):
        same = ev.numel_out == sum(_numel(s) for s in shapes)
        return shapes, shapes if same else [[ev.numel_out]], dtypes, dtypes if same else d0
    return shapes, shapes, dtypes, dtypes  # in place: all_reduce, broadcast, reduce, ...


def _batches(ops: list) -> list[list]:
    """Ops in order, p2p ops issued together (each entered before the one before it
    returned: batch_isend_irecv, a coalescing manager) as one batch."""
    out: list[list] = []
    for ev in ops:
        last = out[-1][-1] if out else None
        if (ev.kind == "p2p" and last is not None and last.kind == "p2p"
                and last.group == ev.group
                and (last.t_end_ns is None or ev.t_enter_ns < last.t_end_ns)):
            out[-1].append(ev)
        else:
            out.append([ev])
    return out


class _RankDump:
    """One rank's dump, built op by op."""

    def __init__(self, run, rank: int, clock: Clock, stats: FrExportStats):
        self.run, self.rank, self.clock, self.stats = run, rank, clock, stats
        self.meta = run.meta.get(rank) or {}
        self.entries: list[dict] = []
        self.groups: dict[str, tuple[str, tuple]] = {}  # name -> (desc, ranks)
        self.coll_seq: dict[str, int] = defaultdict(int)
        self.p2p_seq: dict[str, int] = defaultdict(int)
        self.op_ids: dict[str, int] = defaultdict(int)
        self.status: dict[str, dict] = {}
        self.pg_ids: dict[str, int] = {}
        self.first_record = 0  # the ring wrapped: number from the first event kept

    def wall(self, mono_ns: int | None) -> int | None:
        if mono_ns is None:
            return None
        return self.clock.origin + round(self.clock.us(self.rank, mono_ns) * 1000)

    def pg_id(self, group: str) -> int:
        """The group's number (the recorder's pg_id): its name where that is a number."""
        return self.pg_ids.setdefault(
            group, int(group) if group.isdigit() else 1_000_000 + len(self.pg_ids))

    def add(self, batch: list) -> None:
        first = batch[0]
        self.groups.setdefault(first.group, (first.group_desc or "undefined",
                                             tuple(first.group_ranks)))
        group = first.group
        if first.kind == "p2p":
            self.p2p_seq[group] += 1
        for ev in batch:
            if ev.kind == "collective":
                self.coll_seq[group] = ev.seq + 1
            entry = self.entry(ev)
            if entry is not None:
                self.entries.append(entry)
        if len(batch) > 1:  # the marker NCCL's recorder writes at the end of a batch
            done = all(e.t_end_ns is not None and e.status == "ok" for e in batch)
            marker = self.entry(batch[-1], name="coalesced")
            marker.update(input_sizes=[], input_dtypes=[], output_sizes=[], output_dtypes=[],
                          state="completed" if done else "started",
                          retired=all(e.t_end_ns is not None for e in batch))
            if not done:
                marker["time_discovered_completed_ns"] = None
                marker.pop("duration_ms", None)
            self.entries.append(marker)

    def entry(self, ev, name: str | None = None) -> dict | None:
        backend = _backend(self.meta, ev.device or "")
        table = _GLOO if backend == "gloo" else _NCCL
        fr_name = name or table.get(ev.op)
        group = ev.group
        if fr_name is None or (ev.kind == "p2p" and (ev.peer is None or ev.peer < 0)):
            self.stats.left_out[ev.op] = self.stats.left_out.get(ev.op, 0) + 1
            return None  # recv_anysource: the analyzer cannot pair a recv with no peer
        n = len(ev.group_ranks) or (self.run.world_size or 1)
        if ev.kind == "p2p" and name is None:
            me = ev.group_ranks.index(self.rank) if self.rank in ev.group_ranks else self.rank
            fr_name += f" {me}->{ev.peer}" if ev.op == "send" else f" {me}<-{ev.peer}"
        sizes_in, sizes_out, dt_in, dt_out = _layout(ev, name or fr_name.split(" ")[0], n)
        self.op_ids[group] += 1
        done = ev.t_end_ns is not None and ev.status == "ok"
        started, ended = self.wall(ev.t_enter_ns), self.wall(ev.t_end_ns)
        e = {}
        cs = ev.callsite or {}
        e["frames"] = [{"name": str(f.get("function") or ""), "filename": str(f.get("file") or ""),
                        "line": f.get("line") or 0}
                       for f in ([cs] if cs else []) + list(cs.get("callers") or ())]
        e.update(
            record_id=self.first_record + len(self.entries),
            pg_id=self.pg_id(group), process_group=(group, self.groups[group][0]),
            thread_name=str(cs.get("thread") if cs.get("thread_id") else "MainThread"),
            thread_id=str(cs.get("thread_id") or ""), collective_seq_id=self.coll_seq[group],
            p2p_seq_id=self.p2p_seq[group], op_id=self.op_ids[group],
            profiling_name=f"{backend}:{fr_name}", time_created_ns=started)
        if done:
            e["duration_ms"] = (ev.t_end_ns - ev.t_enter_ns) / 1e6
        e.update(input_sizes=sizes_in, input_dtypes=dt_in, output_sizes=sizes_out,
                 output_dtypes=dt_out, state="completed" if done else "started",
                 time_discovered_started_ns=started,
                 time_discovered_completed_ns=ended if done else None,
                 retired=ev.t_end_ns is not None,
                 timeout_ms=_TIMEOUT_MS.get(backend, 600_000), is_p2p=ev.kind == "p2p")
        if ev.kind == "collective" and name is None:
            st = self.status.setdefault(group, {"last_enqueued_collective": -1,
                                                "last_started_collective": -1,
                                                "last_completed_collective": -1})
            st["last_enqueued_collective"] = st["last_started_collective"] = ev.seq + 1
            if done:
                st["last_completed_collective"] = ev.seq + 1
        return e

    def dump(self) -> dict:
        groups = dict(self.groups)
        default = next((g for g, (desc, _) in groups.items() if desc == "default_pg"), None)
        if default is None and self.run.world_size:  # the world group, which every rank has
            groups.setdefault("0", ("default_pg", tuple(range(self.run.world_size))))
        return {
            "version": FR_VERSION,
            "pg_config": {g: {"name": g, "desc": desc,
                              "ranks": "[" + ", ".join(map(str, ranks)) + "]"}
                          for g, (desc, ranks) in sorted(groups.items())},
            "comm_lib_version": "",
            "pg_status": {str(self.pg_id(g)): st for g, st in self.status.items()},
            "entries": self.entries,
        }


def rank_dumps(run, stats: FrExportStats | None = None) -> dict[int, dict]:
    """rank -> its dump (pickle's layout: tuples, None for times not reached)."""
    stats = stats if stats is not None else FrExportStats()
    clock = Clock(run)
    out = {}
    for rank in sorted(run.events):
        ops = sorted((e for e in run.events[rank] if e.kind in ("collective", "p2p")),
                     key=lambda e: e.index)
        if not ops and rank not in run.meta:
            continue
        rd = _RankDump(run, rank, clock, stats)
        header = run.headers.get(rank)
        if header is not None and header.dropped and ops:
            rd.first_record = ops[0].index
        for batch in _batches(ops):
            rd.add(batch)
        out[rank] = rd.dump()
        stats.entries += len(rd.entries)
    stats.ranks = len(out)
    return out


def as_json(dump: dict) -> dict:
    """The JSON variant, as torch's `_dump_fr_trace_json` writes it: no frames, times not
    reached as 0, pg_status as strings, no "entries" key when there are none."""
    out = {k: v for k, v in dump.items() if k != "entries"}
    out["pg_status"] = {pg: {k: str(v) for k, v in st.items()}
                        for pg, st in dump["pg_status"].items()}
    out["nccl_comm_state"] = {}
    entries = []
    for e in dump["entries"]:
        j = {k: v for k, v in e.items() if k != "frames"}
        j["process_group"] = list(e["process_group"])
        for k in ("time_discovered_started_ns", "time_discovered_completed_ns"):
            j[k] = j[k] or 0
        entries.append(j)
    if entries:
        out["entries"] = entries
    return out


def _encode(dump: dict, fmt: str) -> bytes:
    if fmt == "json":  # nlohmann's dump(): keys sorted, no spaces
        return json.dumps(as_json(dump), sort_keys=True, separators=(",", ":")).encode()
    return pickle.dumps(dump, protocol=2)  # what torch's pickler writes: protocol 2


def _check_dir(path: Path) -> None:
    """torchfrtrace reads every file under DIR as a dump (sub-folders too): it must hold
    nothing else. A set exported before is replaced."""
    if path.exists() and not path.is_dir():
        raise UserError(f"export: {path} is not a directory", 2)
    try:
        foreign = [p.name for p in path.iterdir()
                   if not (p.is_file() and _OUR_FILE.fullmatch(p.name))] if path.exists() else []
    except OSError as exc:
        raise UserError(f"export: cannot read {path}: {exc.strerror}", 2) from None
    if foreign:
        raise UserError(f"export: {path} holds other files ({', '.join(sorted(foreign)[:3])}"
                        f"{', ...' if len(foreign) > 3 else ''}); torchfrtrace reads every "
                        f"file there as a dump: give an empty or new directory", 2)


def write_flight_recorder(run, dest: str | os.PathLike, fmt: str = "pickle") -> FrExportStats:
    """One dump per rank into DEST (made if absent): DEST/nccl_trace_rank_<rank>, pickle,
    or DEST/nccl_trace_rank_<rank>.json. Each file is written whole or not at all."""
    if fmt not in FORMATS:
        raise UserError(f"export: unknown Flight Recorder format {fmt!r}", 2)
    path = Path(dest)
    _check_dir(path)
    stats = FrExportStats()
    dumps = rank_dumps(run, stats)
    try:
        path.mkdir(parents=True, exist_ok=True)
        for old in path.iterdir():  # an earlier export's files: of other ranks, or format
            old.unlink()
        for rank, dump in dumps.items():
            target = path / f"{FILE_PREFIX}{rank}{'.json' if fmt == 'json' else ''}"
            # beside DEST, not in it: a file left by a crash must not pass for a dump
            tmp = path.parent / f".{path.name}.{target.name}.{os.getpid()}.tmp"
            try:
                tmp.write_bytes(_encode(dump, fmt))
                os.replace(tmp, target)
            finally:
                tmp.unlink(missing_ok=True)
            stats.files.append(target)
    except OSError as exc:
        raise UserError(f"export: cannot write {path}: {exc.strerror or exc}", 2) from None
    return stats
