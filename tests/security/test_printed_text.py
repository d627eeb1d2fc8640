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
