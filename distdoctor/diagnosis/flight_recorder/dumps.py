"""Read PyTorch Flight Recorder dumps (`PREFIX<rank>`, pickle or JSON) into event streams.

A job run without distdoctor can still be diagnosed when PyTorch's Flight Recorder was on
(TORCH_FR_BUFFER_SIZE): NCCL writes one dump per rank on a watchdog timeout to
TORCH_FR_DUMP_TEMP_FILE<rank> (default /tmp/nccl_trace_rank_<rank>), and any backend's
recorder can be dumped by hand with `torch._C._distributed_c10d._dump_fr_trace()`. Each
entry becomes an `Event`, so the same detectors serve these dumps and our own logs.

What a dump does not say, the events leave unknown: the reduce op and the root/peer of a
collective (mismatches are judged on op, sizes and dtypes only), and the exact duration
unless timing was on (no straggler verdict from a dump). Gloo records no p2p ops, reports
every entry as "scheduled" (only `retired` tells it finished, and a failed op is retired
too) and leaves `pg_config` empty (members are inferred from the dumps themselves).

Security: unpickling runs code; `files` reads dumps with an unpickler that refuses
every global, so a crafted file lands in `unreadable`, never runs.
"""

from __future__ import annotations

import json
import math
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from distdoctor.diagnosis.flight_recorder.files import Unreadable, find_dump_files, read_dump
from distdoctor.diagnosis.hangs.stackframes import is_library
from distdoctor.errors import UserError
from distdoctor.runlog.reader import Event, RingHeader
from distdoctor.runlog.rundir import MAX_WORLD_SIZE

MAX_MS = 1e12  # an op's duration a dump may claim (30 years): past it, no measurement
# profiling_name (backend prefix and p2p suffix stripped, lower case) -> our op name
_OPS = {
    "allreduce": "all_reduce", "sparse_all_reduce": "all_reduce",
    "allreduce_coalesced": "all_reduce_coalesced",
    "all_reduce_barrier": "barrier",  # NCCL's barrier is an all_reduce named so
    "_broadcast_oop": "broadcast", "_reduce_oop": "reduce",
    "allgather": "all_gather", "_allgather_base": "all_gather_into_tensor",
    "_all_gather_base": "all_gather_into_tensor",  # NCCL's name for it
    "all_gather_base": "all_gather_into_tensor", "all_gather_single": "all_gather_into_tensor",
    "allgather_base": "all_gather_into_tensor",  # torch 2.15's FlightRecorderHook (HookOpName)
    "allgather_coalesced": "all_gather_coalesced",
    "allgather_into_tensor_coalesced": "all_gather_into_tensor_coalesced",
    "reducescatter": "reduce_scatter", "_reduce_scatter_base": "reduce_scatter_tensor",
    "reduce_scatter_base": "reduce_scatter_tensor",
    "reduce_scatter_single": "reduce_scatter_tensor",
    "reduce_scatter_coalesced": "reduce_scatter_tensor_coalesced",
    "alltoall": "all_to_all", "alltoall_base": "all_to_all_single",
    "all_to_all_v_single": "all_to_all_single", "recvanysource": "recv_anysource",
}
# c10::ScalarType names (what dumps hold) -> torch names (what our tracer writes)
_DTYPES = {
    "Float": "float32", "Double": "float64", "Half": "float16", "BFloat16": "bfloat16",
    "Long": "int64", "Int": "int32", "Short": "int16", "Char": "int8", "Byte": "uint8",
    "Bool": "bool", "ComplexFloat": "complex64", "ComplexDouble": "complex128",
    "ComplexHalf": "complex32",
}


@dataclass
class FrDumps:
    events: dict[int, list[Event]] = field(default_factory=dict)
    unreadable: dict[int, str] = field(default_factory=dict)  # rank -> why
    world_size: int | None = None
    # rank -> when its dump file was written (wall clock ns, the clock of time_created_ns):
    # how long its in-flight ops had waited, as a heartbeat would tell
    dump_time_ns: dict[int, int] = field(default_factory=dict)
    files: dict[int, Path] = field(default_factory=dict)

    def headers(self) -> dict[int, RingHeader]:
        """The dump times as the heartbeats `diagnose_events` takes: with them a finding
        says how long the ranks had waited when they were dumped."""
        return {r: RingHeader(rank=r, pid=0, capacity=len(self.events.get(r, ())),
                              head=len(self.events.get(r, ())), strings_dropped=0,
                              heartbeat_mono_ns=t, heartbeat_wall_ns=t, closed=False)
                for r, t in self.dump_time_ns.items() if r in self.events}


# --- entries -------------------------------------------------------------------------
@dataclass
class _Entry:
    """One dump entry, checked and normalised."""

    group: str
    desc: str
    name: str  # our op name, or "coalesced" for the marker that closes a coalesced group
    peer: int | None  # p2p peer, as a group rank
    is_p2p: bool
    seq: int  # collective_seq_id, or p2p_seq_id for p2p
    sizes_in: list
    sizes_out: list
    dtypes: list
    done: bool
    t_created: int
    t_done: int | None
    callsite: dict | None


def _op(profiling_name: str) -> tuple[str, int | None]:
    """'nccl:send 0->1' -> ('send', 1); 'gloo:all_reduce' -> ('all_reduce', None);
    'nccl2:all_reduce' (torch 2.15's nccl2, recorded by its FlightRecorderHook) too. The
    backend is cut from the right, as torch 2.15's analyzer does (flight_recorder/
    components/types.py, `Op`): an op name has no colon, a backend's name might."""
    name = profiling_name.rpartition(":")[2].strip()
    name, _, meta = name.partition(" ")
    name = name.lower()
    peer = None
    m = re.fullmatch(r"(\d+)(->|<-)(\d+)", meta.strip())
    if m:  # "send SELF->PEER", "recv SELF<-PEER", in group ranks
        peer = int(m.group(3))
    return _OPS.get(name, name), peer


def _callsite(frames) -> dict | None:
    """The innermost frame of the user's Python code (frames come innermost first; C++
    frames, with TORCH_FR_CPP_STACK, are skipped)."""
    paths = [(str(f.get("filename", "")).replace("\\", "/"), f) for f in frames or ()
             if isinstance(f, dict)]
    for strict in (True, False):
        for path, f in paths:
            if path.endswith(".py") and not is_library(path, strict):
                return {"file": path, "line": f.get("line"), "function": f.get("name")}
    return None


def _time(v) -> int | None:
    """A timestamp: JSON dumps write 0 where pickles write None."""
    try:
        v = int(v)
    except (TypeError, ValueError, OverflowError):  # (JSON's Infinity, a pickle's inf)
        return None
    return v or None


def _entry(e: dict) -> _Entry | None:
    try:
        pg = e["process_group"]
        name, peer = _op(str(e["profiling_name"]))
        is_p2p = bool(e.get("is_p2p")) or name in ("send", "recv", "recv_anysource")
        t_created = int(e["time_created_ns"])
        completed = _time(e.get("time_discovered_completed_ns"))
        done = e.get("state") == "completed" or bool(e.get("retired")) or completed is not None
        t_done = None
        if done:  # an exact duration if timing was on; else unknown (zero): no straggling
            dur = e.get("duration_ms")
            ok = isinstance(dur, (int, float)) and math.isfinite(dur) and 0 <= dur < MAX_MS
            t_done = t_created + (int(dur * 1e6) if ok else 0)
        return _Entry(
            group=str(pg[0]), desc=str(pg[1]) if len(pg) > 1 else "", name=name, peer=peer,
            is_p2p=is_p2p, seq=int(e["p2p_seq_id"] if is_p2p else e["collective_seq_id"]),
            sizes_in=[list(map(int, s)) for s in e.get("input_sizes") or ()],
            sizes_out=[list(map(int, s)) for s in e.get("output_sizes") or ()],
            dtypes=[_DTYPES.get(str(d), str(d).lower()) for d in e.get("input_dtypes") or ()],
            done=done, t_created=t_created, t_done=t_done, callsite=_callsite(e.get("frames")))
    except (KeyError, TypeError, ValueError, IndexError, OverflowError):
        return None  # a malformed entry (an Infinity for a time): skip it, keep the rest


def _coalesce(entries: list[_Entry]) -> list[list[_Entry]]:
    """Entries grouped into ops, in order. A coalesced group (entries sharing one seq,
    closed by a 'coalesced' marker) is one collective op, or its sends and recvs; the
    marker's state speaks for all of them, since they carry no completion events of their
    own. Entries that merely share a seq without a marker stay apart."""
    markers = {(e.group, e.is_p2p, e.seq): e for e in entries if e.name == "coalesced"}
    out: list[list[_Entry]] = []
    merged: dict[tuple, list[_Entry]] = {}
    for e in entries:
        key = (e.group, e.is_p2p, e.seq)
        marker = markers.get(key)
        if marker is None:
            out.append([e])
            continue
        if e is marker:
            continue
        e.done, e.t_done = marker.done, marker.t_done
        if e.is_p2p:
            out.append([e])  # each send/recv pairs with its own peer
        elif key in merged:
            merged[key].append(e)
        else:
            merged[key] = [e]
            out.append(merged[key])
    return out


def _numel(sizes: list) -> int:
    return sum(math.prod(s) for s in sizes)


# --- assembling ----------------------------------------------------------------------
def _pg_config(dumps: dict[int, dict]) -> dict[str, tuple[str, tuple[int, ...]]]:
    """group name -> (desc, global ranks), where the dumps record it (NCCL does, as the
    string "[0, 1]"; gloo leaves one empty record)."""
    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    for dump in dumps.values():
        cfg = dump.get("pg_config")
        for name, info in (cfg.items() if isinstance(cfg, dict) else ()):
            try:
                ranks = info["ranks"]
                ranks = json.loads(ranks) if isinstance(ranks, str) else ranks
                if ranks and str(name) and len(ranks) <= MAX_WORLD_SIZE:
                    members = tuple(sorted(int(r) for r in ranks))
                    if 0 <= members[0] and members[-1] < MAX_WORLD_SIZE:  # else no job's
                        out.setdefault(str(name), (str(info.get("desc", "")), members))
            except (AttributeError, KeyError, TypeError, ValueError, OverflowError):
                continue
    return out


def _members(config: dict, entries: dict[int, list[_Entry]],
             world: int) -> dict[str, tuple[int, ...]]:
    """group name -> its global ranks: recorded, else the ranks whose dumps used the group
    (the default group is everyone)."""
    out = {name: ranks for name, (_, ranks) in config.items()}
    used: dict[str, set[int]] = defaultdict(set)
    for rank, es in entries.items():
        for e in es:
            used[e.group].add(rank)
            if e.group not in out and (e.desc == "default_pg" or e.group == "0"):
                out[e.group] = tuple(range(world))
    for group, ranks in used.items():
        out.setdefault(group, tuple(sorted(ranks)))
    return out


def _dump_time(dump: dict, mtime_ns: int) -> int | None:
    """When the dump was taken: its file's mtime (the clock of time_created_ns), unless the
    file was copied since (a copy's mtime would make every wait look days long). A dump is
    written on a timeout at the latest, so a plausible one is within twice the longest
    timeout of its newest entry."""
    entries = [e for e in dump.get("entries") or () if isinstance(e, dict)]
    try:
        newest = max(int(e["time_created_ns"]) for e in entries)
        timeout_ms = max(int(e.get("timeout_ms") or 0) for e in entries) or 1_800_000
    except (KeyError, TypeError, ValueError, OverflowError):
        return None
    return mtime_ns if 0 <= mtime_ns - newest <= (2 * timeout_ms + 60_000) * 1_000_000 else None


def load_fr_dumps(prefix: str) -> FrDumps:
    """Every rank's dump at PREFIX, as event streams the detectors read."""
    files = find_dump_files(prefix)
    if not files:
        raise UserError(f"no Flight Recorder dumps at {prefix} (expected one file per rank, "
                        f"{prefix}0, {prefix}1, ...: PyTorch writes them to "
                        f"TORCH_FR_DUMP_TEMP_FILE<rank>)", 2)
    out = FrDumps(files=files)
    dumps: dict[int, dict] = {}
    for rank, path in sorted(files.items()):
        try:
            dumps[rank] = read_dump(path)
            dumped = _dump_time(dumps[rank], path.stat().st_mtime_ns)
            if dumped is not None:
                out.dump_time_ns[rank] = dumped
        except (Unreadable, OSError) as exc:
            out.unreadable[rank] = str(exc)
    if not dumps:
        first = next(iter(out.unreadable.values()))
        raise UserError(f"no readable Flight Recorder dump at {prefix}: {first}", 2)
    entries: dict[int, list[_Entry]] = {}
    partial: set[int] = set()
    for rank, dump in dumps.items():
        raw = [e for e in dump.get("entries") or () if isinstance(e, dict)]
        es = [x for x in map(_entry, raw) if x is not None]
        if raw and not es:
            out.unreadable[rank] = f"{files[rank]} has no entry distdoctor can read"
            continue
        entries[rank] = es
        # records are numbered from 0: a dump that starts later lost its oldest entries
        # (ring buffer full, or an "only active" dump) and cannot tell older ops apart
        if raw and raw[0].get("record_id") not in (0, "0", None):
            partial.add(rank)
    config = _pg_config(dumps)
    default = [ranks for name, (desc, ranks) in config.items()
               if desc == "default_pg" or name == "0"]
    world = out.world_size = max([max(files) + 1] + [len(r) for r in default])
    for rank in range(world):
        if rank not in files:
            out.unreadable[rank] = f"no Flight Recorder dump {prefix}{rank} (did it die first?)"
    ops = {rank: _coalesce(es) for rank, es in entries.items()}
    b = _Builder(_members(config, entries, world), ops, partial, set(files) - set(ops))
    out.events = {rank: b.events(rank) for rank in b.ops}
    return out


class _Builder:
    """Turns each rank's ops into Events whose rendezvous keys and members line up."""

    def __init__(self, members: dict[str, tuple[int, ...]], ops: dict[int, list[list[_Entry]]],
                 partial: set[int], unknown: set[int]):
        self.members, self.ops, self.partial = members, ops, partial
        self.unknown = unknown  # ranks whose dump exists but is unreadable
        self.first_seq: dict[tuple[int, str], int] = {}  # (rank, group) -> oldest seq held
        self.in_flight: set[tuple[str, int]] = set()  # collectives somebody still waits in
        for rank, rank_ops in ops.items():
            for op in rank_ops:
                e = op[0]
                if e.is_p2p:
                    continue
                key = (rank, e.group)
                self.first_seq[key] = min(self.first_seq.get(key, e.seq), e.seq)
                if not all(x.done for x in op):
                    self.in_flight.add((e.group, e.seq))

    def witnesses(self, group: str, seq: int) -> tuple[int, ...]:
        """The members expected at collective (group, seq).

        One that every dumped rank finished is no hang because a member's dump is missing
        or begins later: only the members whose dumps can tell are expected. One somebody
        still waits in keeps the members without a dump: a rank that died leaves none (a
        timeout dumps every live rank), so they are the suspects; a rank whose dump is
        unreadable was alive to write it, and is left out as unknown."""
        full = self.members.get(group, ())
        if (group, seq) in self.in_flight:
            return tuple(r for r in full if r not in self.unknown)
        return tuple(r for r in full if r in self.ops and (
            self.first_seq[(r, group)] <= seq if (r, group) in self.first_seq
            else r not in self.partial))

    def p2p_peer(self, rank: int, e: _Entry, done: bool) -> int | None:
        """The peer (group rank) to pair with, or None where pairing would be a guess."""
        ranks = self.members.get(e.group, ())
        peer = ranks[e.peer] if e.peer is not None and e.peer < len(ranks) else e.peer
        # our p2p seq counts per group, direction and peer (FR's p2p_seq_id per group
        # only), so it is counted here: that needs both ranks' whole histories
        if rank in self.partial or peer in self.partial:
            return None
        if peer in self.ops or (not done and peer not in self.unknown):
            return e.peer  # (in flight towards a rank that left no dump: a suspect)
        return None

    def events(self, rank: int) -> list[Event]:
        out: list[Event] = []
        p2p_seq: dict[tuple, int] = defaultdict(int)
        for op in self.ops[rank]:
            first = op[0]
            names = {e.name for e in op}
            name = names.pop() if len(names) == 1 else "unknown"
            if len(op) > 1 and f"{name}_coalesced" in _COALESCED:
                name = f"{name}_coalesced"
            done = all(e.done for e in op)
            if first.is_p2p:
                seq = p2p_seq[(first.group, name, first.peer)]
                p2p_seq[(first.group, name, first.peer)] += 1
                peer, group_ranks = self.p2p_peer(rank, first, done), self.members.get(
                    first.group, ())
            else:
                seq, peer, group_ranks = first.seq, None, self.witnesses(first.group, first.seq)
            out.append(Event(
                rank=rank, index=len(out), kind="p2p" if first.is_p2p else "collective",
                op=name, status="ok" if done else "in_flight", group=first.group,
                group_desc=first.desc, group_ranks=group_ranks, seq=seq, peer=peer,
                shapes=tuple(tuple(s) for e in op for s in e.sizes_in),
                dtypes=tuple(d for e in op for d in e.dtypes), device="",
                numel_in=sum(_numel(e.sizes_in) for e in op),
                numel_out=sum(_numel(e.sizes_out) for e in op), reduce_op=None,
                callsite=first.callsite, t_enter_ns=min(e.t_created for e in op),
                t_end_ns=max(e.t_done or 0 for e in op) if done else None, span_index=0,
                name=None, error=None, is_async=None, other_thread=False))
        return out


_COALESCED = ("all_reduce_coalesced", "all_gather_coalesced",
              "all_gather_into_tensor_coalesced", "reduce_scatter_tensor_coalesced")
