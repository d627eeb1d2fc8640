"""What a rank says reaches the operator's terminal as text, never as terminal control.

A rank's exception message is quoted in distdoctor's crash finding, live (`run`) and
post-mortem (`diagnose`). Here it holds a clear-screen, an OSC window-title sequence, a
C1 control and rich markup: distdoctor's own lines must carry none of them as control,
and the markup must neither style text nor raise (rich's MarkupError on `[/x]`)."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import JOBS, run_cli

JOB = JOBS / "security" / "raise_escapes.py"


def _distdoctor_lines(text: str) -> list[str]:
    """distdoctor's own lines (the job's own stderr, its traceback, is passed through)."""
    lines, ours = [], False
    for line in text.splitlines():
        if line.startswith(("distdoctor:", "    at ")) or (line[:1].isdigit() and ". " in line[:5]):
            ours = True
        elif not line.startswith(" "):
            ours = False
        if ours:
            lines.append(line)
    return lines


def test_a_ranks_escape_codes_are_printed_as_text(tmp_path: Path):
    run_dir = tmp_path / "run"
    done = run_cli(["run", "--nproc", "2", "--run-dir", str(run_dir), "--hang-timeout", "10",
                    "--on-hang", "kill", "--", "python", str(JOB)],
                   timeout=90, run_dir=run_dir)
    live = _distdoctor_lines(done.stderr)
    assert any("bad batch" in line for line in live), done.stderr[-3000:]
    for line in live:
        assert "\x1b" not in line and "\x9b" not in line and "\x07" not in line, repr(line)
    report = run_cli(["diagnose", str(run_dir)], timeout=60)
    assert "Traceback" not in report.stderr, report.stderr
    assert "bad batch" in report.stdout, report.stdout
    assert "[/x]" in report.stdout  # shown as the text it is
    for bad in ("\x1b", "\x9b", "\x07"):
        assert bad not in report.stdout, repr(report.stdout)


def test_the_dashboard_shows_a_findings_words_as_text():
    """The dashboard's findings table and detail pane (Textual writes a Text's characters
    to the terminal as they are)."""
    from distdoctor.tui import cells

    from distdoctor.findings import Finding

    said = "rank 1 raised bad batch \x1b[2J\x1b]0;owned\x07 [/x] \x9b31m"
    f = Finding("crash", "error", said, [1], remedy="see \x1b[5m",
                callsites=[{"rank": 1, "file": "/job\x1b[31m.py", "line": 3}],
                stacks={"1": "Thread 1\n  at \x1b[2Jjob.py:3\n"})
    shown = [c.plain for c in cells.finding_cells(f)] + [cells.finding_detail(f).plain]
    for text in shown:
        for bad in ("\x1b", "\x9b", "\x07"):
            assert bad not in text, repr(text)
    assert "[/x]" in shown[3] and "job.py:3" in shown[-1]


MARKUP_JOB = JOBS / "security" / "markup_names.py"
BAD = ("\x1b", "\x9b", "\x07")


def test_show_and_diagnose_print_a_ranks_names_and_the_users_path_as_text(tmp_path: Path):
    """A group description and a span name from the job's code, in `show`'s tables; and
    a run dir whose path reads as markup (`a[/x]b`), in every header that names it."""
    (tmp_path / "a[").mkdir()
    run_dir = tmp_path / "a[" / "x]b"
    done = run_cli(["run", "--nproc", "2", "--run-dir", str(run_dir), "--", "python",
                    str(MARKUP_JOB)], timeout=90, run_dir=run_dir)
    assert done.returncode == 0, done.stderr[-3000:]
    wide = {"COLUMNS": "200"}
    for args in (["show", str(run_dir)], ["show", str(run_dir), "--rank", "0"],
                 ["diagnose", str(run_dir)]):
        res = run_cli(args, timeout=60, env=wide)
        assert res.returncode == 0 and "Traceback" not in res.stderr, (args, res.stderr)
        if "--rank" not in args:  # (one rank's table is titled by its rank)
            assert "a[/x]b" in res.stdout, (args, res.stdout)  # the path, as given
        for bad in BAD:
            assert bad not in res.stdout, (args, repr(res.stdout))
    side = run_cli(["show", str(run_dir)], timeout=60, env=wide).stdout
    one = run_cli(["show", str(run_dir), "--rank", "0"], timeout=60, env=wide).stdout
    assert "[/x] mesh" in side and "[bold]tp" in side, side  # the group, not styled
    assert "[/y] step" in one, one  # the span


def test_check_prints_what_a_collective_raised_as_text():
    """`check`'s table quotes what a rank's collective raised: gloo's messages open with
    its source path in brackets, a closing tag to rich."""
    from rich.console import Console

    from distdoctor.check.table import Row, render

    said = ("[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed "
            "by peer [127.0.0.1]:29501 \x1b[2J")
    console = Console(record=True, width=300, color_system=None)
    render([Row("all_reduce", "job", "fail", said, "see [/x]")], console, 1.0, 2)
    out = console.export_text()
    assert "[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:534]" in out, out
    assert "see [/x]" in out and "\x1b" not in out, repr(out)


def _no_control(text: str, where) -> None:
    for bad in BAD:
        assert bad not in text, (where, repr(text[-2000:]))


def test_the_dashboards_cells_print_a_ranks_and_a_nodes_words_as_text(tmp_path: Path):
    """`watch --once` (the dashboard's cells): a group's description from the job's code,
    a host name as a peer node could send it, the job's path."""
    (tmp_path / "a[").mkdir()
    script = tmp_path / "a[" / "x]job\x1b[7m.py"  # .../a[/x]job<ESC>[7m.py
    script.write_text(MARKUP_JOB.read_text())
    run_dir = tmp_path / "run"
    done = run_cli(["run", "--nproc", "2", "--run-dir", str(run_dir), "--", "python",
                    str(script)], timeout=90, run_dir=run_dir)
    assert done.returncode == 0, done.stderr[-3000:]
    _no_control(done.stderr, "run's own lines")
    for meta in (run_dir / "ranks").glob("rank-*.json"):  # a node's host, as sent
        data = json.loads(meta.read_text())
        meta.write_text(json.dumps({**data, "host": "vm\x1b[2J[/h]\x1b]0;owned\x07"}))
    res = run_cli(["watch", str(run_dir), "--once"], timeout=60, env={"COLUMNS": "250"})
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr
    _no_control(res.stdout, "watch --once")
    assert "[/x] mesh" in res.stdout and "[/h]" in res.stdout, res.stdout
    from distdoctor.tui import cells

    from distdoctor.views.rank import RankRow

    row = RankRow(rank=1, host="vm\x1b[2J", pid=1, state="running",
                  where="in \x1b]0;t\x07x", callsite="a\x1b[7m.py:3", last_done=None,
                  collectives=1, rate=None, span="s\x1b[2J", lateness_ms=None)
    shown = [c.plain for c in cells.rank_cells(row, set())]
    shown.append(cells.rank_detail(row, []).plain)
    _no_control("".join(shown), "cells")


def test_a_leftover_process_with_an_odd_name_is_named_as_text(tmp_path: Path):
    run_dir = tmp_path / "run"
    done = run_cli(["run", "--grace", "1", "--run-dir", str(run_dir), "--", "python",
                    str(JOBS / "security" / "leave_odd_argv.py")], timeout=60,
                   run_dir=run_dir)
    assert "remain after" in done.stderr, done.stderr
    _no_control(done.stderr, "run")
    _no_control((run_dir / "exits.json").read_text(), "exits.json")


def test_an_error_quoting_the_users_path_is_one_line_of_text(tmp_path: Path):
    odd = str(tmp_path / "e\x1b[2J\x1b]0;owned\x07[/x]d")
    for args in (["show", odd], ["diagnose", "--fr-dump", odd], ["export", odd, "--perfetto",
                                                                  str(tmp_path / "x.json")]):
        res = run_cli(args, timeout=60)
        assert res.returncode != 0 and "Traceback" not in res.stderr, (args, res.stderr)
        assert "[/x]d" in res.stderr, (args, res.stderr)
        _no_control(res.stderr, args)


def test_the_find_box_quotes_what_the_user_typed_as_text():
    """The dashboard says which ranks its find box matched, quoting the query: `[/x]`
    typed there stopped the dashboard with rich's MarkupError."""
    import asyncio

    from test_watch_units import big_job_dashboard

    app = big_job_dashboard("/runs/x\x1b[2J")

    async def drive():
        async with app.run_test(size=(200, 60)) as pilot:
            await pilot.pause(0.3)
            await pilot.press("slash", "left_square_bracket", "slash", "x",
                              "right_square_bracket", "enter")
            await pilot.pause(0.2)
            shown = str(app.query_one("#shown").render())
            assert "[/x]" in shown, shown
            assert "\x1b" not in app.sub_title, repr(app.sub_title)

    asyncio.run(drive())


def test_demo_names_a_run_dir_that_reads_as_markup_as_given(tmp_path: Path):
    (tmp_path / "d[").mkdir()
    run_dir = tmp_path / "d[" / "x]e"
    res = run_cli(["demo", "--no-dashboard", "--nproc", "2", "--steps", "1", "--run-dir",
                   str(run_dir)], timeout=120, run_dir=run_dir)
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr[-3000:]
    assert f"distdoctor watch {run_dir}" in res.stderr or "d[/x]e" in res.stderr, res.stderr
