"""A run as a Chrome Trace Event JSON timeline, which ui.perfetto.dev (and chrome://tracing)
opens.

What the UI shows:
- one process per rank (pid = rank), named "rank 3 (host)";
- in it a "spans" track (`distdoctor.trace` spans, nested), one track per process group
  with its collectives ("group 0 (default_pg) [0-7]"), and one per group for p2p ops;
- each op is a complete ("X") slice named after the op, with its details in args: group,
  seq, shapes, dtypes, numel, reduce op, root/peer, status, async, call site, span;
- an op still in flight is drawn up to the rank's last heartbeat and named
  "all_reduce (in flight)"; a failed one "all_reduce (error)";
- each finding is an instant event on each culprit rank (on the global track when it names
  no rank), at the culprit's own op where its log has it.

Perfetto's JSON importer drops a slice that overlaps a neighbour on its track without
nesting inside it. Async ops and batched p2p do overlap, so such a slice goes to an extra
lane of its track, named "... (overlap 2)"; a track without overlaps keeps one lane.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from distdoctor.errors import UserError
from distdoctor.export.clock import Clock
from distdoctor.findings import framework_text
from distdoctor.runlog.run import span_name
from distdoctor.runlog.unpack import shown

OP_KINDS = ("collective", "p2p")
_NAME_MAX = 160  # characters of a finding's summary used as the instant's name
_LIST_MAX = 240  # characters of a shapes/dtypes list kept in args
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=str)


@dataclass
class ExportStats:
    slices: int = 0  # "X" events: ops and spans
    op_slices: int = 0
    span_slices: int = 0
    in_flight: int = 0
    findings: int = 0
    ranks: int = 0
    clock: str = ""


class _Lanes:
    """Lanes of one track: a slice goes to the first lane where it starts after the lane's
    open slices end, or (spans only) nests inside the innermost one."""

    def __init__(self, nest: bool):
        self.nest = nest
        self.open: list[list[int]] = []  # per lane: ends of open slices, innermost last

    def place(self, start: int, end: int) -> int:
        for lane, stack in enumerate(self.open):
            while stack and stack[-1] <= start:
                stack.pop()
            if not stack or (self.nest and end <= stack[-1]):
                stack.append(end)
                return lane
        self.open.append([end])
        return len(self.open) - 1


# --- names ---------------------------------------------------------------------------------
def _clean(text: str) -> str:
    return "".join(c if c >= " " else " " for c in str(text))


def rank_ranges(ranks) -> str:
    """(0, 1, 2, 3, 8) -> "0-3,8"; long lists are cut."""
    parts, stretch = [], []
    for r in list(ranks) + [None]:
        if r is not None and stretch and r == stretch[-1] + 1:
            stretch.append(r)
            continue
        if stretch:
            parts.append(str(stretch[0]) if len(stretch) == 1
                         else f"{stretch[0]}-{stretch[-1]}")
        stretch = [r]
    if len(parts) > 8:
        return ",".join(parts[:6]) + f",... ({len(ranks)} ranks)"
    return ",".join(parts)


def group_label(ev) -> str:
    desc = ev.group_desc if ev.group_desc and ev.group_desc != "undefined" else ""
    label = f"group {ev.group}" + (f" ({desc})" if desc else "")
    return label + (f" [{rank_ranges(ev.group_ranks)}]" if ev.group_ranks else "")


def callsite_text(cs) -> str:
    if not cs:
        return "?"
    text = f"{cs.get('file', '?')}:{cs.get('line', '?')} {cs.get('function') or ''}".rstrip()
    callers = cs.get("callers") or ()
    if callers:
        text += f" (from {callers[0].get('file', '?')}:{callers[0].get('line', '?')})"
    fw = framework_text(cs)
    if fw:
        text += f" (in {fw})"
    if cs.get("thread_id"):
        text += f" [thread {cs.get('thread')}]"
    return text


def _cut(text: str, limit: int = _LIST_MAX) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _track_key(ev) -> tuple:
    if ev.kind == "span":
        return ("spans",)
    return ("p2p" if ev.kind == "p2p" else "group", ev.group)


def _track_order(key: tuple) -> tuple:
    if key[0] == "spans":
        return (0,)
    g = key[1]
    return (1, (0, int(g), "") if g.isdigit() else (1, 0, g), key[0] == "p2p")


def _track_name(key: tuple, ev, lane: int) -> str:
    name = "spans" if key[0] == "spans" else group_label(ev)
    if key[0] == "p2p":
        name = f"p2p in {name}"
    return _clean(name + (f" (overlap {lane + 1})" if lane else ""))


# --- events --------------------------------------------------------------------------------
def trace_events(run, findings, stats: ExportStats) -> Iterator[dict]:
    """Every trace event of the run, rank by rank, then the findings."""
    clock = Clock(run)
    stats.clock = clock.mode
    ranks = sorted({r for r, evs in run.events.items() if evs}
                   | {r for f in findings for r in f.ranks if isinstance(r, int)})
    stats.ranks = len(ranks)
    # tids are unique in the whole trace and never equal a pid: Perfetto names a thread by
    # tid alone, and the pid of a process doubles as its main thread's tid.
    tids = itertools.count(max(ranks, default=-1) + 1)
    for rank in ranks:
        meta = run.meta.get(rank) or {}
        host = meta.get("host") if isinstance(meta, dict) else None
        name = f"rank {rank}" + (f" ({host})" if host else "")
        yield {"ph": "M", "ts": 0, "pid": rank, "tid": rank, "name": "process_name",
               "args": {"name": _clean(name)}}
        yield {"ph": "M", "ts": 0, "pid": rank, "tid": rank, "name": "process_sort_index",
               "args": {"sort_index": rank}}
        yield from _rank_events(run, rank, clock, tids, stats)
    yield from _finding_events(run, findings, clock, stats)


def _rank_events(run, rank: int, clock: Clock, tids, stats: ExportStats) -> Iterator[dict]:
    events = sorted(run.events.get(rank, ()), key=lambda e: (e.t_enter_ns, e.index))
    if not events:
        return
    end_ns = clock.rank_end_ns(rank)
    lanes: dict[tuple, _Lanes] = {}
    first_of: dict[tuple, object] = {}
    placed = []
    for ev in events:
        key = _track_key(ev)
        stop = max(ev.t_end_ns if ev.t_end_ns is not None else end_ns, ev.t_enter_ns)
        track = lanes.get(key)
        if track is None:
            track = lanes[key] = _Lanes(nest=key[0] == "spans")
            first_of[key] = ev
        placed.append((ev, key, track.place(ev.t_enter_ns, stop), stop))
    tid_of: dict[tuple, int] = {}
    for order, key in enumerate(sorted(lanes, key=_track_order)):
        for lane in range(len(lanes[key].open)):
            tid = tid_of[(key, lane)] = next(tids)
            yield {"ph": "M", "ts": 0, "pid": rank, "tid": tid, "name": "thread_name",
                   "args": {"name": _track_name(key, first_of[key], lane)}}
            yield {"ph": "M", "ts": 0, "pid": rank, "tid": tid, "name": "thread_sort_index",
                   "args": {"sort_index": order * 1000 + lane}}
    spans = run.span_names(rank)
    for ev, key, lane, stop in placed:
        yield _slice(ev, clock, tid_of[(key, lane)], stop, spans, stats)


def _slice(ev, clock: Clock, tid: int, stop: int, spans: dict, stats: ExportStats) -> dict:
    is_span = ev.kind == "span"
    in_flight = ev.t_end_ns is None
    name = span_name(ev) if is_span else ev.op
    if in_flight:
        name += " (open)" if is_span else " (in flight)"
    elif ev.status != "ok":
        name += f" ({ev.status})"
    out = {"ph": "X", "ts": clock.us(ev.rank, ev.t_enter_ns), "dur": (stop - ev.t_enter_ns) / 1000,
           "pid": ev.rank, "tid": tid, "cat": ev.kind, "name": _clean(name)}
    if in_flight or ev.status not in ("ok", "in_flight"):
        out["cname"] = "terrible" if in_flight else "bad"
    args: dict = {"status": ev.status}
    if not is_span:
        args.update(group=ev.group, group_desc=ev.group_desc, seq=ev.seq, op=ev.op,
                    shapes=_cut(json.dumps([list(s) for s in ev.shapes])),
                    dtypes=_cut(", ".join(map(str, ev.dtypes))),
                    numel_in=ev.numel_in, numel_out=ev.numel_out)
        if ev.device:
            args["device"] = ev.device
        if ev.reduce_op:
            args["reduce_op"] = ev.reduce_op
        if ev.peer is not None:
            args["peer" if ev.kind == "p2p" else "root"] = ev.peer_global
        args["async"] = "unknown" if ev.is_async is None else ev.is_async
    args["callsite"] = callsite_text(ev.callsite)
    if ev.span_index and ev.span_index in spans:
        args["span"] = spans[ev.span_index]
    if ev.error:
        args["error"] = ev.error
    if in_flight:
        args["in_flight_until"] = "the rank's last heartbeat (its clock is unknown after it)"
        stats.in_flight += 1
    else:
        args["duration_ms"] = (ev.t_end_ns - ev.t_enter_ns) / 1e6
    if ev.other_thread:
        args["other_thread"] = True
    args["event"] = ev.index
    out["args"] = args
    stats.slices += 1
    if is_span:
        stats.span_slices += 1
    else:
        stats.op_slices += 1
    return out


def _finding_events(run, findings, clock: Clock, stats: ExportStats) -> Iterator[dict]:
    wanted = {(f.group, f.seq) for f in findings if f.group is not None and f.seq is not None}
    at: dict[tuple, list] = {}
    if wanted:
        for evs in run.events.values():
            for ev in evs:
                if ev.kind in OP_KINDS and (ev.group, ev.seq) in wanted:
                    at.setdefault((ev.group, ev.seq), []).append(ev)
    for f in findings:
        stats.findings += 1
        evs = at.get((f.group, f.seq), [])
        args = {"kind": f.kind, "severity": f.severity, "summary": f.summary,
                "ranks": rank_ranges(sorted(f.ranks)), "group": f.group, "seq": f.seq,
                "callsites": [f"rank {c.get('rank')}: {callsite_text(c)}"
                              for c in f.callsites],
                "details": f.details, "remedy": f.remedy}
        name = _clean(_cut(f.summary, _NAME_MAX))
        if not f.ranks:
            ts, where = _finding_time(f, None, evs, clock)
            yield {"ph": "i", "ts": ts, "s": "g", "cat": "finding", "name": name,
                   "args": {**args, "placed_at": where}}
            continue
        for rank in sorted(set(f.ranks)):
            ts, where = _finding_time(f, rank, evs, clock)
            one = {**args, "placed_at": where}
            if f.stacks.get(str(rank)):
                one["stack"] = f.stacks[str(rank)]
            yield {"ph": "i", "ts": ts, "s": "p", "pid": rank, "tid": rank, "cat": "finding",
                   "name": name, "args": one}


def _finding_time(f, rank, evs: list, clock: Clock) -> tuple[float, str]:
    """When to show a finding on a rank: at the culprit's op (group, seq) where its log has
    it; else where the other ranks entered that op (the rank never did); else at the end of
    the rank's trace."""
    mine = [e for e in evs if e.rank == rank]
    if mine:
        lines = {c.get("line") for c in f.callsites if c.get("rank") == rank}
        mine.sort(key=lambda e: (e.callsite is None or e.callsite.get("line") not in lines,
                                 e.t_end_ns is not None, e.index))
        return clock.us(rank, mine[0].t_enter_ns), "the culprit's op"
    others = [e for e in evs if clock.knows(e.rank)]
    if others:
        return (min(clock.us(e.rank, e.t_enter_ns) for e in others),
                "where the other ranks entered this op")
    return clock.rank_end_us(rank), "the end of the trace"


# --- writing -------------------------------------------------------------------------------
def _dump(fh, run, findings, stats: ExportStats) -> None:
    from distdoctor import __version__

    # Key order matters to Perfetto's streaming importer: displayTimeUnit first, and
    # traceEvents last (it stops at a top-level key it does not know).
    fh.write('{"displayTimeUnit":"ms","otherData":')
    events = trace_events(run, findings, stats)
    first = next(events, None)  # runs the clock set-up, which fills stats.clock
    fh.write(_ENCODER.encode({"generator": f"distdoctor {__version__}",
                              "run_dir": shown(run.path), "clock": stats.clock,
                              "world_size": run.world_size}))
    fh.write(',"traceEvents":[\n')
    if first is not None:
        fh.write(_ENCODER.encode(first))
        for ev in events:
            fh.write(",\n")
            fh.write(_ENCODER.encode(ev))
    fh.write("\n]}\n")


def write_perfetto(run, findings, dest: str | os.PathLike) -> ExportStats:
    """Write the run's timeline to `dest` ("-": stdout), atomically: a reader sees the
    old file or the whole new one. An unwritable destination is a `UserError`."""
    stats = ExportStats()
    if str(dest) == "-":
        _dump(sys.stdout, run, findings, stats)
        sys.stdout.flush()
        return stats
    path = Path(dest)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    done = False
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            _dump(fh, run, findings, stats)
        os.replace(tmp, path)
        done = True
    except OSError as exc:
        raise UserError(f"export: cannot write {path}: {exc.strerror or exc}", 2) from None
    finally:
        if not done:
            try:
                tmp.unlink()
            except OSError:
                pass
    return stats
