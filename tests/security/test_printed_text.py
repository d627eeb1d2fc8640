"""What a rank says reaches the operator's terminal as text, never as terminal control.

A rank's exception message is quoted in distdoctor's crash finding, live (`run`) and
post-mortem (`diagnose`). Here it holds a clear-screen, an OSC window-title sequence, a
C1 control and rich markup: distdoctor's own lines must carry none of them as control,
and the markup must neither style text nor raise (rich's MarkupError on `[/x]`)."""

from __future__ import annotations

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
