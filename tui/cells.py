"""How the dashboard writes a snapshot's values: rich Text per cell, colour by meaning.

Plain functions of `distdoctor.views.snapshot` rows, so the colours and wording are
tested without a terminal."""

from __future__ import annotations

from rich.text import Text

from distdoctor.diagnosis.report import rank_ranges, site_text
from distdoctor.findings import Finding
from distdoctor.safetext import printable
from distdoctor.views.rank import RankRow
from distdoctor.views.snapshot import GroupRow, JobSnapshot, OpRow

STATE_STYLE = {
    "running": "green", "in collective": "cyan", "starting": "dim", "long wait": "yellow",
    "hung": "bold red", "no heartbeat": "bold yellow", "failed": "bold red", "exited": "dim",
}
SEVERITY_STYLE = {"error": "bold red", "warning": "bold yellow", "info": "cyan"}

RANK_COLUMNS = ("rank", "host", "state", "where", "line", "last done", "coll/s", "span",
                "late ms/step", "cpu %", "rss", "gpu")
GROUP_COLUMNS = ("group", "ranks", "issued", "behind")
FINDING_COLUMNS = ("severity", "kind", "ranks", "summary")
# Fixed widths for the dashboard's ranks table: sizing a column to its content measures
# every row of it, per updated cell (6.8 s a redraw for 256 ranks; 12 columns x 256 rows)
RANK_WIDTHS = {"rank": 5, "host": 10, "state": 13, "where": 52, "line": 22, "last done": 22,
               "coll/s": 6, "span": 10, "late ms/step": 12, "cpu %": 5, "rss": 10, "gpu": 22}

# Up to this many ranks the table shows them all; past it, the notable ones (a redraw of
# Textual's table costs ~0.3 ms a row: 4,096 rows would not refresh once a second)
FULL_TABLE = 256
NOTABLE_MAX = 200
STATE_ORDER = ("failed", "hung", "no heartbeat", "long wait", "in collective", "running",
               "starting", "exited")

# A rank whose mean per-step lateness is above this is worth the reader's eye (the
# straggler detector itself also asks for a t-statistic; this is only a colour)
LATE_MS = 5.0


def _said(text, limit: int = 300, style: str = "") -> Text:
    """A value a rank, a node or the user wrote (a host, a line, a group's description, a
    path): its characters, never terminal control (rich's Text passes ESC through)."""
    return Text(printable(text, limit), style=style)


def _num(value, fmt: str, style: str = "") -> Text:
    return Text("-" if value is None else format(value, fmt), style=style, justify="right")


def _bytes(n: int | None) -> Text:
    if n is None:
        return Text("-", justify="right")
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return Text(f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}", justify="right")
        n /= 1024
    raise AssertionError("unreachable")


def elide_head(text: str, width: int) -> str:
    """`…_parallel.py:127`: a long file:line loses its head, never its line number."""
    return text if len(text) <= width else "\u2026" + text[len(text) - width + 1:]


def rank_cells(row: RankRow, culprits: set[int]) -> tuple:
    """One ranks-table row; a rank some finding blames gets its number in red."""
    late = row.lateness_ms
    late_style = "bold yellow" if late is not None and late > LATE_MS else "dim"
    return (
        Text(str(row.rank), style="bold red" if row.rank in culprits else "bold",
             justify="right"),
        _said(row.host or "?"),
        Text(row.state, style=STATE_STYLE.get(row.state, "")),
        _said(row.where),
        # (made printable before it is cut to its width: what the width counts is shown)
        Text(elide_head(printable(row.callsite), RANK_WIDTHS["line"]) if row.callsite
             else "-", style="dim" if row.callsite is None else ""),
        _said(row.last_done or "-"),
        _num(row.rate, ".0f"),
        _said(row.span or "-"),
        _num(late, "+.1f", late_style),
        _num(row.cpu_pct, ".0f"),
        _bytes(row.rss_bytes),
        _said(row.gpu or "-"),
    )


def group_cells(row: GroupRow) -> tuple:
    counts = sorted(set(row.issued.values()))
    issued = (f"{counts[0]}" if len(counts) == 1 else f"{counts[0]}..{counts[-1]}"
              ) if counts else "-"
    name = row.group + (f" ({row.desc})" if row.desc else "")
    return (
        _said(name),
        Text(rank_ranges(row.ranks)),
        Text(issued, justify="right"),
        Text(rank_ranges(row.behind) if row.behind else "-",
             style="bold red" if row.behind else "dim"),
    )


def finding_cells(f: Finding) -> tuple:
    return (
        Text(f.severity, style=SEVERITY_STYLE.get(f.severity, "")),
        Text(f.label, style=SEVERITY_STYLE.get(f.severity, "")),
        Text(rank_ranges(f.ranks) if f.ranks else "-"),
        Text(printable(f.summary)),
    )


def finding_detail(f: Finding) -> Text:
    """Everything about one finding, for the detail pane under the findings table. Its
    words may quote a rank, a log or a node: shown as text, never as terminal control."""
    out = Text()
    out.append(f"{f.label} ", style=SEVERITY_STYLE.get(f.severity, "bold"))
    out.append(f"({f.severity})\n", style="dim")
    out.append(printable(f.summary) + "\n")
    if f.group is not None:
        out.append(f"group {f.group}" + (f", seq {f.seq}" if f.seq is not None else "") + "\n",
                   style="dim")
    for cs in f.callsites[:12]:
        out.append(f"  {printable(site_text(cs))}\n")
    if f.remedy:
        out.append("try: ", style="bold")
        out.append(printable(f.remedy) + "\n")
    for rank, stack in sorted(f.stacks.items(), key=lambda kv: int(kv[0])):
        out.append(f"stack of rank {rank}:\n", style="bold")
        out.append(printable(stack.rstrip(), 20000, keep_newlines=True) + "\n", style="dim")
    return out


def rank_detail(row: RankRow, ops: list[OpRow]) -> Text:
    """One rank, for the detail pane: where it is, then its newest ops, newest last."""
    out = Text()
    out.append(f"rank {row.rank}", style="bold")
    out.append(f"  {printable(row.host or '?', 300)}  "
               f"pid {row.pid if row.pid is not None else '?'}  ")
    out.append(row.state, style=STATE_STYLE.get(row.state, ""))
    out.append(f"\n{printable(row.where)}\n")
    if row.step_split:
        out.append(f"{printable(row.step_split)}\n", style="dim")
    if row.straggler:
        out.append("why late: ", style="bold yellow")
        out.append(printable(row.straggler.split(": ", 1)[-1]) + "\n")
    if not ops:
        out.append("no ops seen since this view started\n", style="dim")
    for op in ops:
        took = ("-" if op.ms is None else f"{op.ms:.1f} ms" if op.ms < 1000 else
                f"{op.ms / 1000:.1f} s")
        status = "in flight" if op.status == "in_flight" else op.status
        style = {"ok": "", "in_flight": "cyan"}.get(op.status, "bold red")
        out.append(printable(f"  #{op.index:<7} {op.op} #{op.seq} in {op.group}  "
                             f"{op.tensors}  "), style=style)
        out.append(f"{status} {took}", style=style or "dim")
        out.append(f"  {printable(op.callsite or '')}\n", style="dim")
    return out


def header_line(s: JobSnapshot) -> Text:
    counts = s.counts
    out = Text()
    out.append(s.state, style={"running": "bold green", "finished": "bold"}.get(s.state, "dim"))
    seen = len(s.ranks)
    out.append(f"  ranks {seen}" + (f"/{s.world_size}" if s.world_size else ""))
    alive = sum(r.state not in ("exited", "failed") for r in s.ranks)
    out.append(f" ({alive} alive)")
    if s.elapsed_s is not None:
        m, sec = divmod(int(s.elapsed_s), 60)
        out.append(f"  up {m // 60:d}:{m % 60:02d}:{sec:02d}")
    out.append(f"  events {s.events:,}")
    out.append("  findings: ")
    if not s.findings:
        out.append("none", style="green")
    for sev in ("error", "warning", "info"):
        if counts.get(sev):
            out.append(f"{counts[sev]} {sev}  ", style=SEVERITY_STYLE[sev])
    out.append(f"\n{printable(s.run_dir)}", style="dim")
    if s.command:
        out.append(f"  $ {printable(s.command, 1000)}", style="dim")
    for note in s.notes:
        out.append(f"\nnote: {printable(note)}", style="yellow")
    return out


def culprits_of(snap: JobSnapshot) -> set[int]:
    return {r for f in snap.findings for r in f.ranks}


def state_summary(snap: JobSnapshot) -> Text:
    """The job in a few lines, however many ranks: the culprits the findings name, then
    the ranks grouped by state ("in collective 4093  ranks 0-4095 except 17, 2048")."""
    out = Text()
    everyone = [r.rank for r in snap.ranks]
    if not everyone:
        return out
    culprits = culprits_of(snap)
    if culprits:
        hosts = {r.rank: r.host for r in snap.ranks}
        kinds = sorted({f.label for f in snap.findings if f.ranks})
        where = ""
        if len(culprits) <= 4:
            where = " (" + ", ".join(f"{r} on {printable(hosts.get(r) or '?', 200)}"
                                     for r in sorted(culprits)) + ")"
        out.append(f"{'culprits':<14}", style="bold red")
        out.append(f"{len(culprits):>6}  ranks {rank_ranges(culprits)}{where}: "
                   f"{', '.join(kinds)}\n")
    by_state: dict[str, list[int]] = {}
    for r in snap.ranks:
        by_state.setdefault(r.state, []).append(r.rank)
    order = sorted(by_state, key=lambda s: (STATE_ORDER.index(s) if s in STATE_ORDER
                                            else len(STATE_ORDER), s))
    for state in order:
        ranks = by_state[state]
        out.append(f"{state:<14}", style=STATE_STYLE.get(state, ""))
        out.append(f"{len(ranks):>6}  ranks {rank_ranges(ranks, among=everyone)}\n")
    out.rstrip()
    return out


def _matches(row: RankRow, query: list[tuple]) -> bool:
    for kind, a, b in query:
        if kind == "range" and a <= row.rank <= b:
            return True
        if kind == "word" and (a in (row.host or "").lower() or a == row.state.lower()):
            return True
    return False


def parse_query(text: str) -> list[tuple]:
    """What the ranks table's find box takes: ranks and ranges ("17", "100-200"), host
    names or parts of one, and states ("hung"), separated by commas or spaces."""
    out = []
    for word in text.replace(",", " ").split():
        lo, dash, hi = word.partition("-")
        if lo.isdigit() and (not dash or hi.isdigit()):
            out.append(("range", int(lo), int(hi) if dash else int(lo)))
        else:
            out.append(("word", word.lower(), None))
    return out


def ranks_shown(snap: JobSnapshot, show_all: bool = False,
                query: str = "") -> tuple[list[RankRow], str]:
    """The rows the ranks table shows and a line saying which: every rank of a job up to
    FULL_TABLE ranks (or when asked); past it the notable ones first — the culprits, the
    ranks not in the most common state, the late ones — at most NOTABLE_MAX; or those a
    query names."""
    rows = snap.ranks
    total = len(rows)
    if query.strip():
        found = [r for r in rows if _matches(r, parse_query(query))]
        return found[:NOTABLE_MAX * 5], (f"{len(found)} of {total} ranks match "
                                          f"{query.strip()!r} (esc: clear)")
    if show_all or total <= FULL_TABLE:
        return rows, ""
    culprits = culprits_of(snap)
    counts: dict[str, int] = {}
    for r in rows:
        counts[r.state] = counts.get(r.state, 0) + 1
    usual = max(counts, key=counts.get)

    def rank_of(r: RankRow) -> int:
        if r.rank in culprits:
            return 0
        if r.state != usual:
            return 1
        if r.straggler or (r.lateness_ms is not None and r.lateness_ms > LATE_MS):
            return 2
        return 3

    notable = sorted((r for r in rows if rank_of(r) < 3), key=lambda r: (rank_of(r), r.rank))
    shown = sorted(notable[:NOTABLE_MAX], key=lambda r: r.rank)
    return shown, (f"{len(shown)} notable of {total} ranks (the culprits, those not "
                   f"'{usual}', the late ones)  a: all  /: find")


def groups_shown(groups: list[GroupRow], limit: int = 64) -> list[GroupRow]:
    """Every group of a small job; of a large one (a TP group per 8 ranks) the ones where
    a rank fell behind first, then the rest up to `limit`."""
    if len(groups) <= limit:
        return groups
    behind = [g for g in groups if g.behind]
    return behind[:limit] + [g for g in groups if not g.behind][:max(0, limit - len(behind))]
