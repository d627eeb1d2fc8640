"""`distdoctor watch`: the live dashboard of a running (or finished) job.

  distdoctor watch                         # newest run under ./distdoctor-runs
  distdoctor watch RUN_DIR                 # a job started with `distdoctor run`, or one
                                           # that calls distdoctor.install() itself
  distdoctor watch RUN_DIR --once          # one snapshot as text (scripts, no terminal)
  distdoctor watch --listen 0.0.0.0:7070   # every node of a multi-node job, each started
                                           # with `distdoctor run --forward HEAD:7070`

With --listen, this is the collector: the nodes' logs are copied into RUN_DIR (default: a
new run dir), which it shows; without a terminal it prints findings as they come until
stopped (a service on the head node). A non-loopback address needs $DISTDOCTOR_TOKEN,
set alike on every node.

It only reads the run dir: start and stop it at will, beside `distdoctor run` or from
another shell; the job never notices. Keys: r/g/f focus ranks/groups/findings, arrows
select a finding (its call sites, remedy and stacks show below), p pauses, q quits.
Past 256 ranks the table shows the notable ones (the summary above it groups all of them
by state): a shows every rank, / finds ranks ("17", "100-200"), hosts or states.

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
    p.add_argument("--listen", metavar="HOST:PORT",
                   help="collect the logs `distdoctor run --forward` sends from each node")
    p.add_argument("--refresh", type=common.seconds_arg, default=0.5, metavar="S",
                   help="seconds between redraws (0.5)")
    p.add_argument("--metrics", metavar="HOST:PORT",
                   help="with --listen: serve every rank as Prometheus metrics at /metrics "
                   "(loopback unless $DISTDOCTOR_TOKEN is set)")
    common.add_tls(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from distdoctor.runlog.rundir import open_run_dir

    if args.backlog is not None and args.backlog < 0:
        raise UserError("watch: --backlog must be 0 or more", 2)
    if args.listen:
        return _collect(args)
    if args.metrics:
        raise UserError("watch: --metrics serves a collector's view: use it with --listen "
                        "(or `distdoctor run --metrics` on each node)", 2)
    if not args.once and not _on_terminal():
        raise UserError("watch: the dashboard needs a terminal; use --once to print one "
                        "snapshot", 2)
    info = open_run_dir(args.run_dir)
    hang_timeout = common.hang_timeout_s(args.hang_timeout, info.hang_timeout_s)
    backlog = (args.backlog if args.backlog is not None
               else default_backlog(info.meta.get("world_size")))
    if args.once:
        return _print_once(_viewer(info.path, hang_timeout, backlog))
    show(info.path, hang_timeout, backlog, args.refresh)
    return 0


def _on_terminal() -> bool:
    return sys.stdin.isatty() and sys.stdout.isatty()


def _collect(args) -> int:
    """`watch --listen`: the collector, with the dashboard on a terminal, else as a
    service printing findings until SIGTERM or Ctrl-C."""
    import os
    import signal
    import threading
    import time

    from distdoctor.collect.descriptors import raise_open_files_limit
    from distdoctor.collect.server import Collector, is_loopback, listen, parse_address
    from distdoctor.console import err_console
    from distdoctor.diagnosis.report import live_line
    from distdoctor.runlog import rundir
    from distdoctor.safetext import printable

    if args.once:
        raise UserError("watch: --once reads a run dir; --listen collects one", 2)
    host, port = parse_address(args.listen, "watch --listen")
    token = os.environ.get("DISTDOCTOR_TOKEN") or None
    if token is None and not is_loopback(host):
        raise UserError(f"watch: listening on {host} (not loopback) needs a shared token: "
                        f"set DISTDOCTOR_TOKEN here and on every node", 2)
    hang_timeout = common.hang_timeout_s(args.hang_timeout)  # None: by progress
    tls = common.tls_settings(args)  # the flags, else DISTDOCTOR_TLS_*
    listener = listen((host, port), tls)
    metrics = None
    if args.metrics:
        from distdoctor.export.metrics_http import bind_metrics

        try:
            metrics = bind_metrics(args.metrics, "watch", tls)
        except UserError:
            listener.close()
            raise
    run_dir = rundir.claim_run_dir(args.run_dir, "watch --listen")
    rundir.write_run_meta(run_dir, launcher="distdoctor watch --listen",
                          command=["distdoctor", "watch", "--listen", args.listen],
                          hang_timeout_s=hang_timeout)
    dashboard = _on_terminal()

    def print_finding(f):
        # a node's finding: its words are the node's (escape codes, markup), made text
        err_console.print(live_line(_printable_finding(f)))

    def say(line: str) -> None:
        line = printable(line)  # it names peers and says what they sent
        if dashboard:  # the screen is the dashboard's: the nodes' comings and goings
            with open(run_dir / "collector.log", "a") as log:
                log.write(f"{time.strftime('%H:%M:%S')} {line}\n")
        else:
            err_console.print(f"distdoctor: {line}", markup=False, highlight=False,
                              soft_wrap=True)  # one line, however long

    # The viewer is made (and all it imports read) before the first node comes: a flood
    # of connections at start must find no module left to open
    if dashboard:
        live = _viewer(run_dir, hang_timeout, args.backlog or DEFAULT_BACKLOG)
        from distdoctor.tui.app import WatchApp  # noqa: F401 (imported before serving)
    else:
        live = _viewer(run_dir, hang_timeout, args.backlog, on_finding=print_finding)
    collector = Collector(run_dir, listener, token, say=say,
                          on_finding=None if dashboard else print_finding,
                          hang_timeout_s=hang_timeout).start()
    host, port = collector.address
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"  # (IPv6, as typed)
    err_console.print(f"distdoctor: collecting on {where} ({tls.server_words()}) into "
                      f"{printable(run_dir)}", markup=False, highlight=False, soft_wrap=True)
    low = raise_open_files_limit()  # (start() raised it already: what is left to say)
    if low:
        say(low)
    try:
        if dashboard:
            show(run_dir, hang_timeout, args.backlog or DEFAULT_BACKLOG, args.refresh,
                 metrics=metrics, fleet=collector.mirror.fleet, live=live)
            return 0
        done = threading.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: done.set())
        live.start()
        if metrics is not None:
            _serve_metrics(metrics, live, collector.mirror.fleet)
        done.wait()
        live.leave()
        return 0
    finally:
        if metrics is not None:
            metrics.stop()
        collector.stop()
        nodes = ", ".join([f"{h} ({n} connection(s))" for h, n in sorted(collector.nodes.items())]
                          + [f"{collector.rankless} connection(s) of nodes that sent no rank"]
                          * bool(collector.rankless))
        err_console.print(f"distdoctor: collected {printable(nodes) or 'no node'} into "
                          f"{printable(run_dir)}", markup=False, highlight=False, soft_wrap=True)


def _printable_finding(f):
    """A copy of a node's finding whose text prints as text: escape sequences and other
    control characters out of what a line shows (rich's Text takes no markup)."""
    import dataclasses

    from distdoctor.safetext import printable

    sites = [{**c, **{k: printable(c[k], 300) for k in ("file", "function") if k in c}}
             for c in f.callsites if isinstance(c, dict)]
    return dataclasses.replace(f, summary=printable(f.summary), callsites=sites)


def show(run_dir, hang_timeout_s: float | None, backlog: int = DEFAULT_BACKLOG,
         refresh_s: float = 0.5, metrics=None, fleet=None, live=None) -> None:
    """The dashboard of `run_dir` until the user quits it (also `distdoctor demo`'s);
    `metrics`: a bound MetricsServer to serve the same view; `fleet`: the collector's
    engine over the nodes that send digests; `live`: its viewer, made already."""
    from distdoctor.tui.app import WatchApp

    from distdoctor.views.snapshot import SnapshotTaker

    live = (live or _viewer(run_dir, hang_timeout_s, backlog)).start()
    if metrics is not None:
        _serve_metrics(metrics, live, fleet)
    try:
        WatchApp(SnapshotTaker(live, fleet=fleet), refresh_s=refresh_s).run()
    finally:
        live.leave()


def _serve_metrics(metrics, live, fleet=None) -> None:
    from distdoctor.console import err_console

    metrics.serve(live, fleet=fleet)
    err_console.print(f"distdoctor: metrics at {metrics.url}", highlight=False)


def _viewer(run_dir, hang_timeout_s: float | None, backlog: int | None, on_finding=None):
    from distdoctor.diagnosis.live import LiveDiagnosis

    return LiveDiagnosis(run_dir, hang_timeout_s, stacks="none", owner=False, backlog=backlog,
                         exits=lambda: _exits(run_dir), on_finding=on_finding)


def _exits(run_dir) -> dict[int, tuple[int | None, bool]]:
    """Exit codes `distdoctor run` wrote when the job ended (none while it runs)."""
    from distdoctor.diagnosis.postmortem import read_exits

    exits, _ = read_exits(run_dir)
    return {r: (e.code, e.how == "stopped") for r, e in exits.items()}


def _print_once(live) -> int:
    from distdoctor.tui import cells
    from rich.console import Console
    from rich.table import Table

    from distdoctor.views.snapshot import SnapshotTaker

    try:
        live.pass_once()
        snap = SnapshotTaker(live).take()
    except UserError:
        raise
    except Exception as exc:  # a run dir changing under us in a way no reader foresaw
        from distdoctor.diagnosis.live import failure_line

        raise UserError(f"watch: cannot read {live.run_dir}: {failure_line(exc)} (a bug "
                        f"in distdoctor)") from None
    finally:
        live.close()
    # a pipe or a log gets whole lines: rich would fold a 12-column table into 80 columns
    console = Console(width=None if sys.stdout.isatty() else 200, highlight=False)
    console.print(cells.header_line(snap))
    console.print(cells.state_summary(snap))
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
