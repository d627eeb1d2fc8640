"""`distdoctor watch`: the live dashboard of a running (or finished) job.

  distdoctor watch                         # newest run under ./distdoctor-runs
  distdoctor watch RUN_DIR                 # a job started with `distdoctor run`, or one
                                           # that calls distdoctor.install() itself
  distdoctor watch RUN_DIR --once          # one snapshot as text (scripts, no terminal)

It only reads the run dir: start and stop it at will, beside `distdoctor run` or from
another shell; the job never notices. Keys: r/g/f focus ranks/groups/findings, arrows
select a finding (its call sites, remedy and stacks show below), p pauses, q quits.

Registered with the `distdoctor` command through the "distdoctor.commands" entry point,
so the core never imports the dashboard (DESIGN.md: tui -> core, never core -> tui).
"""

from __future__ import annotations

import argparse
import sys

from distdoctor.cli import common
from distdoctor.errors import UserError

# Events read from before the viewer started: 20,000 per rank, and 400,000 in all at most
# (the first pass reads them all before the first picture: ~2 s at the engine's pace)
DEFAULT_BACKLOG = 20_000
BACKLOG_BUDGET = 400_000


def default_backlog(world_size) -> int:
    if not isinstance(world_size, int) or world_size < 1:
        return DEFAULT_BACKLOG
    return max(1_000, min(DEFAULT_BACKLOG, BACKLOG_BUDGET // world_size))


def register(sub) -> None:
    p = sub.add_parser("watch", help="live dashboard of a running job", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    common.add_run_dir(p)
    p.add_argument("--once", action="store_true",
                   help="print one snapshot as text and exit (no terminal needed)")
    common.add_run_hang_timeout(p)
    p.add_argument("--backlog", type=int, metavar="N",
                   help=f"events per rank to read from before now ({DEFAULT_BACKLOG:,}, "
                   f"fewer past {BACKLOG_BUDGET // DEFAULT_BACKLOG} ranks; "
                   f"0: only new ones)")
    p.add_argument("--refresh", type=float, default=0.5, metavar="S",
                   help="seconds between redraws (0.5)")
    p.set_defaults(func=run)


def run(args) -> int:
    from distdoctor.runlog.rundir import open_run_dir

    common.check_hang_timeout(args.hang_timeout, "watch")
    if args.backlog is not None and args.backlog < 0:
        raise UserError("watch: --backlog must be 0 or more", 2)
    if args.refresh <= 0:
        raise UserError("watch: --refresh must be positive", 2)
    if not args.once and not (sys.stdin.isatty() and sys.stdout.isatty()):
        raise UserError("watch: the dashboard needs a terminal; use --once to print one "
                        "snapshot", 2)
    info = open_run_dir(args.run_dir)
    hang_timeout = args.hang_timeout if args.hang_timeout is not None else info.hang_timeout_s
    backlog = (args.backlog if args.backlog is not None
               else default_backlog(info.meta.get("world_size")))
    if args.once:
        return _print_once(_viewer(info.path, hang_timeout, backlog))
    show(info.path, hang_timeout, backlog, args.refresh)
    return 0


def show(run_dir, hang_timeout_s: float, backlog: int = DEFAULT_BACKLOG,
         refresh_s: float = 0.5) -> None:
    """The dashboard of `run_dir` until the user quits it (also `distdoctor demo`'s)."""
    from distdoctor.tui.app import WatchApp

    from distdoctor.diagnosis.snapshot import SnapshotTaker

    live = _viewer(run_dir, hang_timeout_s, backlog).start()
    try:
        WatchApp(SnapshotTaker(live), refresh_s=refresh_s).run()
    finally:
        live.leave()


def _viewer(run_dir, hang_timeout_s: float, backlog: int):
    from distdoctor.diagnosis.live import LiveDiagnosis

    return LiveDiagnosis(run_dir, hang_timeout_s, stacks="none", owner=False, backlog=backlog,
                         exits=lambda: _exits(run_dir))


def _exits(run_dir) -> dict[int, tuple[int | None, bool]]:
    """Exit codes `distdoctor run` wrote when the job ended (none while it runs)."""
    from distdoctor.diagnosis.postmortem import read_exits

    exits, _ = read_exits(run_dir)
    return {r: (e.code, e.how == "stopped") for r, e in exits.items()}


def _print_once(live) -> int:
    from distdoctor.tui import cells
    from rich.console import Console
    from rich.table import Table

    from distdoctor.diagnosis.snapshot import SnapshotTaker

    try:
        live.pass_once()
        snap = SnapshotTaker(live).take()
    except UserError:
        raise
    except Exception as exc:  # a run dir changing under us in a way no reader foresaw
        raise UserError(f"watch: cannot read {live.run_dir}: {exc!r}") from None
    finally:
        live.close()
    # a pipe or a log gets whole lines: rich would fold a 12-column table into 80 columns
    console = Console(width=None if sys.stdout.isatty() else 200, highlight=False)
    console.print(cells.header_line(snap))
    for title, columns, rows in (
            ("ranks", cells.RANK_COLUMNS, [cells.rank_cells(
                r, {c for f in snap.findings for c in f.ranks}) for r in snap.ranks]),
            ("groups", cells.GROUP_COLUMNS, [cells.group_cells(g) for g in snap.groups]),
            ("findings", cells.FINDING_COLUMNS, [cells.finding_cells(f)
                                                 for f in snap.findings])):
        if not rows:
            continue
        shown = [i for i in range(len(columns)) if any(row[i].plain != "-" for row in rows)]
        table = Table(title=title, title_justify="left", show_edge=False)
        for i in shown:
            table.add_column(columns[i])
        for row in rows:
            table.add_row(*(row[i] for i in shown))
        console.print(table)
    return 1 if any(f.severity == "error" for f in snap.findings) else 0
