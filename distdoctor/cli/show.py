"""Show each rank's collective sequence: seq, group, op, shapes, dtype, time, call site.

  distdoctor show                          # newest run under ./distdoctor-runs
  distdoctor show RUN_DIR --last 20        # ranks side by side, last 20 collectives
  distdoctor show RUN_DIR --rank 3         # one rank, every op (p2p and spans too)
  distdoctor show RUN_DIR --json           # the same events as JSON
  distdoctor show RUN_DIR --incarnation 0  # the first launch of ranks that restarted

Side by side, collectives are aligned by (group, sequence number); a cell that differs
from the other ranks' is red, and a rank with nothing at that position shows a dash.
"""

from __future__ import annotations

import argparse
import json
import os
from collections import Counter
from dataclasses import asdict

from distdoctor.cli import common
from distdoctor.errors import UserError
from distdoctor.runlog.unpack import shown  # a pack: named as the user gave it
from distdoctor.safetext import for_rich  # what the ranks wrote is text, never markup

CELL_WIDTH = 30


def register(sub) -> None:
    p = sub.add_parser("show", help="per-rank collective sequence", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_run_dir(p)
    p.add_argument("--rank", type=int, metavar="R", help="show only rank R, every op")
    p.add_argument("--last", type=int, metavar="N", help="only the last N rows")
    p.add_argument("--json", action="store_true", help="print events as JSON")
    common.add_incarnation(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from distdoctor.console import console

    if args.last is not None and args.last < 1:
        raise UserError("show: --last must be at least 1", 2)
    run_ = common.read_incarnation(args, "show", None if args.rank is None else [args.rank])
    if args.rank is not None and args.rank not in run_.events:
        known = ", ".join(map(str, run_.info.ring_ranks)) or "none"
        raise UserError(f"show: rank {args.rank} has no event log in {shown(run_.path)} "
                        f"(ranks with logs: {known})")
    if args.json:
        print(json.dumps(_as_json(run_, args.last), indent=1))
        return 0
    which = common.incarnation_line(run_, "show")
    if which:
        console.print(for_rich(which))
    for rank, why in sorted(run_.unreadable.items()):
        console.print(f"[yellow]rank {rank}: {for_rich(why)}[/]")
    if not run_.events:
        console.print(f"no event logs in {for_rich(shown(run_.path))} (did any rank create "
                      "a process group?)")
        return 0
    for rank, header in sorted(run_.headers.items()):
        if header.dropped:
            console.print(f"[yellow]rank {rank}: {header.dropped} oldest events were "
                          f"overwritten (ring of {header.capacity})[/]")
    ranks = sorted(run_.events)
    if args.rank is None and 16 + (CELL_WIDTH + 2) * len(ranks) <= console.width:
        console.print(side_by_side(run_, ranks, args.last))
    else:
        for rank in ranks:
            console.print(rank_table(run_, rank, args.last))
    return 0


def _as_json(run_, last):
    out = {}
    for rank, events in sorted(run_.events.items()):
        events = events[-last:] if last else events
        out[str(rank)] = [asdict(e) for e in events]
    return {"run_dir": shown(run_.path), "incarnation": run_.incarnation,
            "incarnations": run_.incarnations, "ranks": out}


# --- formatting --------------------------------------------------------------------------
_DT = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "float64": "f64",
       "int64": "i64", "int32": "i32", "int8": "i8", "uint8": "u8", "bool": "bool"}


# Each fmt_* is rich markup: what a rank wrote in it (dtypes, files, names) is escaped.
def fmt_tensors(ev) -> str:
    if not ev.shapes:
        return "-"
    parts = [f"{_DT.get(d, d)}[{','.join(map(str, s))}]" for s, d in zip(ev.shapes, ev.dtypes, strict=False)]
    if len(parts) > 2:
        return for_rich(f"{parts[0]} +{len(parts) - 1} more")
    return for_rich(" ".join(parts))


def fmt_callsite(ev) -> str:
    cs = ev.callsite
    if not cs:
        return "?"
    return for_rich(f"{os.path.basename(str(cs.get('file', '?')))}:{cs.get('line', '?')} "
                    f"{cs.get('function', '')}")


def fmt_duration(ev) -> str:
    if ev.status == "in_flight":
        return "[yellow]in flight[/]"
    ms = ev.duration_ms
    text = "?" if ms is None else (f"{ms:.3f}ms" if ms < 10 else f"{ms:.0f}ms")
    return text if ev.status == "ok" else f"[red]{ev.status}[/] {text}"


def group_label(ev) -> str:
    return for_rich(ev.group_desc or ev.group, 200)


def signature(ev) -> tuple:
    """What must agree across ranks at one (group, seq)."""
    return (ev.op, ev.shapes, ev.dtypes, ev.reduce_op, ev.peer)


# --- tables -------------------------------------------------------------------------------
def rank_table(run_, rank: int, last: int | None):
    from rich import box
    from rich.table import Table

    spans = run_.span_names(rank)
    events = run_.events[rank]
    events = events[-last:] if last else events
    meta = run_.meta.get(rank, {})
    title = f"rank {rank}" + (f" · {meta.get('host')} pid {meta.get('pid')}" if meta else "")
    title = for_rich(title, 400)
    t = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
    for col in ("group", "seq", "op", "tensors", "peer", "time", "span", "call site"):
        t.add_column(col, overflow="fold", no_wrap=col in ("seq", "op", "time"))
    for ev in events:
        if ev.kind == "span":  # (a new_group span's group: the group it creates)
            t.add_row(group_label(ev) if ev.group_ranks else "", "",
                      f"[cyan]span {for_rich(ev.name, 200)}[/]", "", "",
                      fmt_duration(ev), for_rich(spans.get(ev.span_index, ""), 200),
                      fmt_callsite(ev))
            continue
        peer = "" if ev.peer is None else str(ev.peer_global)
        t.add_row(group_label(ev), str(ev.seq), for_rich(ev.op, 100), fmt_tensors(ev), peer,
                  fmt_duration(ev), for_rich(spans.get(ev.span_index, ""), 200),
                  fmt_callsite(ev))
    return t


def side_by_side(run_, ranks: list[int], last: int | None):
    from rich import box
    from rich.table import Table

    cells: dict[tuple, dict[int, object]] = {}
    order: dict[tuple, int] = {}
    p2p = 0
    for rank in ranks:
        for ev in run_.events[rank]:
            if ev.kind == "p2p":
                p2p += 1
            if ev.kind != "collective":
                continue
            key = (ev.group, ev.seq)
            cells.setdefault(key, {})[rank] = ev
            order[key] = min(order.get(key, ev.index), ev.index)
    keys = sorted(cells, key=lambda k: (order[k], k))
    keys = keys[-last:] if last else keys
    t = Table(title=f"{for_rich(shown(run_.path))} · collectives by (group, seq)"
              + (f" · {p2p} p2p ops: see --rank" if p2p else ""), title_justify="left",
              box=box.SIMPLE_HEAD, pad_edge=False)
    t.add_column("group")
    t.add_column("seq", no_wrap=True)
    for rank in ranks:
        t.add_column(f"rank {rank}", overflow="fold", max_width=CELL_WIDTH)
    for key in keys:
        row = cells[key]
        majority = Counter(signature(ev) for ev in row.values()).most_common(1)[0][0]
        first = next(iter(row.values()))
        out = [group_label(first), str(key[1])]
        for rank in ranks:
            ev = row.get(rank)
            if ev is None:
                out.append("[dim]—[/]")
                continue
            text = (f"{for_rich(ev.op, 100)} {fmt_tensors(ev)} {fmt_duration(ev)}\n"
                    f"[dim]{fmt_callsite(ev)}[/]")
            out.append(f"[red]{text}[/]" if signature(ev) != majority else text)
        t.add_row(*out)
    return t
