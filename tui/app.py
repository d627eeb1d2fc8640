"""The dashboard: a running job's ranks, groups and findings, redrawn twice a second.

It draws `JobSnapshot`s and nothing else: the live engine (`LiveDiagnosis` as a viewer)
follows the run dir on its own thread, and a worker thread takes each snapshot, so a slow
pass over a large job never freezes the screen.

However many ranks, the summary comes first: the culprits, then the ranks grouped by
state as ranges. The ranks table shows every rank of a job up to cells.FULL_TABLE ranks;
of a larger one the notable ranks (`a` shows all, `/` finds ranks, hosts or states).
"""

from __future__ import annotations

import re

from distdoctor.tui import cells
from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widgets import DataTable, Footer, Header, Input, Static

from distdoctor.runlog.unpack import shown
from distdoctor.safetext import printable
from distdoctor.views.snapshot import JobSnapshot, SnapshotTaker

REFRESH_S = 0.5


class WatchApp(App):
    TITLE = "distdoctor watch"
    AUTO_FOCUS = "#ranks"
    CSS = """
    #summary { height: auto; padding: 0 1; }
    #states { height: auto; max-height: 10; padding: 0 1; border-top: solid $secondary; }
    #shown { height: auto; padding: 0 1; color: $text-muted; }
    #find { display: none; }
    #find.open { display: block; }
    #ranks { height: 1fr; }
    #lower { height: 2fr; }
    #groups { width: 2fr; }
    #right { width: 5fr; }
    #findings { height: 1fr; }
    #detail-box { height: 1fr; border-top: solid $secondary; }
    #detail { padding: 0 1; }
    """
    BINDINGS = [
        Binding("q", "quit", "quit"),
        Binding("r", "focus('ranks')", "ranks"),
        Binding("g", "focus('groups')", "groups"),
        Binding("f", "focus('findings')", "findings"),
        Binding("p", "pause", "pause/resume"),
        Binding("a", "all_ranks", "all ranks"),
        Binding("slash", "find", "find"),
        Binding("escape", "clear_find", "clear", show=False),
    ]

    def __init__(self, taker: SnapshotTaker, refresh_s: float = REFRESH_S):
        super().__init__()
        self.taker = taker
        self.refresh_s = refresh_s
        self.paused = False
        self.snapshot: JobSnapshot | None = None
        self._taking = False
        self._detail: tuple[str, int] = ("finding", 0)  # what the detail pane shows
        # per table and row key, the (text, style) of each cell on screen
        self._shown: dict[str, dict[str, tuple]] = {"ranks": {}, "groups": {}}
        self._finding_ids: list[tuple] = []  # which findings the table shows
        self._finding_texts: list[tuple] = []  # and what they say (a hang's wait grows)
        self.show_all = False  # every rank in the table, however many
        self.find_text = ""  # what the find box asked for

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("reading the run directory...", id="summary")
        yield Static("", id="states")
        yield Static("", id="shown")
        yield Input(placeholder="ranks (17, 100-200), hosts or states (hung); enter to find",
                    id="find", disabled=True)  # closed: keys go to the tables
        yield DataTable(id="ranks", cursor_type="row", zebra_stripes=True)
        with Horizontal(id="lower"):
            yield DataTable(id="groups", cursor_type="row")
            with Vertical(id="right"):
                yield DataTable(id="findings", cursor_type="row")
                with VerticalScroll(id="detail-box"):
                    yield Static("no findings yet", id="detail")
        yield Footer()

    def on_mount(self) -> None:
        for table_id, columns in (("ranks", cells.RANK_COLUMNS), ("groups", cells.GROUP_COLUMNS),
                                  ("findings", cells.FINDING_COLUMNS)):
            table = self.query_one(f"#{table_id}", DataTable)
            for name in columns:
                table.add_column(name, key=name, width=cells.RANK_WIDTHS.get(name)
                                 if table_id == "ranks" else None)
        self.sub_title = printable(shown(self.taker.live.run_dir))
        self._take()
        self.set_interval(self.refresh_s, self._take)

    # --- refresh -----------------------------------------------------------------------
    def _take(self) -> None:
        # one snapshot at a time: a thread worker cannot be cancelled, so a slow pass of
        # the engine (which holds its lock) must not queue more of them behind it
        if not self.paused and not self._taking:
            self._taking = True
            self.run_worker(self._take_in_thread, thread=True, group="snap")

    def _take_in_thread(self) -> None:
        try:
            snap = self.taker.take()
        except Exception as exc:  # the view shows what went wrong; the job never notices
            self.call_from_thread(self._show_failure, exc)
        else:
            self.call_from_thread(self.show, snap)
        finally:
            self._taking = False

    def _show_failure(self, exc: Exception) -> None:
        self.query_one("#summary", Static).update(Text.assemble(
            ("cannot read the run directory: ", "bold red"), repr(exc), " (retrying)"))

    def show(self, snap: JobSnapshot) -> None:
        self.snapshot = snap
        self.query_one("#summary", Static).update(cells.header_line(snap))
        self.query_one("#states", Static).update(cells.state_summary(snap))
        culprits = cells.culprits_of(snap)
        rows, which = cells.ranks_shown(snap, self.show_all, self.find_text)
        self.query_one("#shown", Static).update(Text(printable(which)))  # quotes the find box
        _fill(self.query_one("#ranks", DataTable), self._shown["ranks"],
              [(str(r.rank), cells.rank_cells(r, culprits)) for r in rows],
              cells.RANK_COLUMNS)
        _fill(self.query_one("#groups", DataTable), self._shown["groups"],
              [(g.group, cells.group_cells(g)) for g in cells.groups_shown(snap.groups)],
              cells.GROUP_COLUMNS)
        self._show_findings(snap)

    def _show_findings(self, snap: JobSnapshot) -> None:
        table = self.query_one("#findings", DataTable)
        ids = [f.key for f in snap.findings]
        texts = [(f.severity, f.summary) for f in snap.findings]
        if ids != self._finding_ids or texts != self._finding_texts:
            row = table.cursor_row
            table.clear()
            for i, f in enumerate(snap.findings):
                table.add_row(*cells.finding_cells(f), key=str(i))
            if snap.findings:
                row = min(max(row, 0), len(snap.findings) - 1)
                table.move_cursor(row=row)
                if ids != self._finding_ids:  # a new finding goes first in the detail pane
                    self._detail = ("finding", row)
            self._finding_ids, self._finding_texts = ids, texts
        self._show_detail()

    def _show_detail(self) -> None:
        """The selected finding, or the selected rank with its newest ops: whichever table
        the user moved in last."""
        snap = self.snapshot
        detail = self.query_one("#detail", Static)
        what, which = self._detail
        # the next snapshots carry this rank's ops (all ranks' would cost 10x the snapshot)
        self.taker.detail_rank = which if what == "rank" else None
        if snap is None:
            return
        if what == "rank":
            row = next((r for r in snap.ranks if r.rank == which), None)
            if row is not None:
                detail.update(cells.rank_detail(row, snap.recent.get(which, [])))
                return
        if not snap.findings:
            detail.update("no findings: every collective so far matched and completed "
                          "(select a rank to see its newest ops)")
            return
        index = which if what == "finding" else 0  # a rank gone from view: the first finding
        detail.update(cells.finding_detail(snap.findings[min(max(index, 0),
                                                             len(snap.findings) - 1)]))

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        table = event.data_table
        if not table.has_focus:  # a redraw moved the cursor, not the user
            return
        if table.id == "findings":
            self._detail = ("finding", event.cursor_row)
        elif table.id == "ranks" and event.row_key is not None and event.row_key.value:
            self._detail = ("rank", int(event.row_key.value))
        else:
            return
        self._follow_detail(table.id)

    # --- actions -----------------------------------------------------------------------
    def action_focus(self, table_id: str) -> None:
        """Focus a table; the detail pane follows to its selected rank or finding."""
        table = self.query_one(f"#{table_id}", DataTable)
        table.focus()
        if table_id == "findings":
            self._detail = ("finding", table.cursor_row)
        elif table_id == "ranks" and table.row_count:
            key = table.coordinate_to_cell_key((table.cursor_row, 0)).row_key.value
            self._detail = ("rank", int(key))
        self._follow_detail(table_id)

    def _follow_detail(self, table_id: str) -> None:
        self._show_detail()
        if table_id == "ranks":
            self._take()  # the rank's ops come with the next snapshot: take it now

    def action_all_ranks(self) -> None:
        self.show_all = not self.show_all
        self._redraw()

    def action_find(self) -> None:
        box = self.query_one("#find", Input)
        box.disabled = False
        box.add_class("open")
        box.focus()

    def action_clear_find(self) -> None:
        box = self.query_one("#find", Input)
        box.value, self.find_text = "", ""
        self._close(box)
        self.query_one("#ranks", DataTable).focus()
        self._redraw()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.find_text = event.value
        if not event.value.strip():
            self._close(event.input)
        self.query_one("#ranks", DataTable).focus()
        self._redraw()

    @staticmethod
    def _close(box: Input) -> None:
        box.remove_class("open")
        box.disabled = True

    def _redraw(self) -> None:
        if self.snapshot is not None:
            self.show(self.snapshot)

    def action_pause(self) -> None:
        self.paused = not self.paused
        self.sub_title = (printable(shown(self.taker.live.run_dir))
                          + ("  [paused]" if self.paused else ""))


def _fill(table: DataTable, shown: dict[str, tuple], rows: list[tuple[str, tuple]],
          columns: tuple[str, ...]) -> None:
    """Update rows in place by key (the cursor and scroll stay put), only the cells whose
    text or colour changed (`shown`: what each row's cells look like on screen, kept up to
    date here); add new rows; drop rows that went away."""
    wanted = {key for key, _ in rows}
    for key in [k for k in shown if k not in wanted]:
        table.remove_row(key)
        del shown[key]
    added = False
    for key, values in rows:
        looks = tuple((v.plain, str(v.style)) for v in values)
        old = shown.get(key)
        if old is None:
            table.add_row(*values, key=key)
            added = True
        else:
            for column, value, was, now in zip(columns, values, old, looks, strict=True):
                if was != now:
                    table.update_cell(key, column, value)
        shown[key] = looks
    if added:  # rows appear in any order (a launcher starts its ranks one by one)
        table.sort(columns[0], key=lambda cell: _natural(cell.plain))


def _natural(text: str):
    """Rank and group numbers in number order ("2" before "10"), names after them."""
    head = re.match(r"\d+", text)
    return (0, int(head.group()), text) if head else (1, 0, text)
