"""`distdoctor watch`: the dashboard and `--once` on a real job that hangs while watched.

One 4-rank gloo job (tests/jobs/bugs/stuck_outside.py: rank 3 spins in its data loader,
the others wait in an all_reduce) runs under `distdoctor run --on-hang report` for the
whole module; the dashboard is driven headless through Textual's Pilot.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import JOBS, _kill_ranks, marker_lines, run_cli, run_job

from distdoctor.diagnosis.live import LiveDiagnosis
from distdoctor.views.snapshot import SnapshotTaker

HANG_TIMEOUT_S = 3


@pytest.fixture(scope="module")
def hung_job(tmp_path_factory):
    """A running job whose rank 3 is stuck outside any collective (hang diagnosed)."""
    run_dir = tmp_path_factory.mktemp("watch") / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "distdoctor", "run", "--nproc", "4", "--run-dir", str(run_dir),
         "--hang-timeout", str(HANG_TIMEOUT_S), "--on-hang", "report", "--",
         str(JOBS / "bugs" / "stuck_outside.py")],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if "hang" in _kinds(run_dir):
                break
            assert proc.poll() is None, "the job ended before it hung"
            time.sleep(0.2)
        else:
            pytest.fail("the owner never diagnosed the hang")
        yield run_dir
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        _kill_ranks(run_dir)


def _kinds(run_dir: Path) -> set[str]:
    try:
        return {f["kind"] for f in json.loads((run_dir / "findings.json").read_text())["findings"]}
    except (OSError, ValueError, KeyError):
        return set()


@pytest.mark.timeout(150)
def test_once_shows_who_waits_where_and_the_hang(hung_job):
    proc = run_cli(["watch", str(hung_job), "--once"], timeout=60)
    assert proc.returncode == 1, proc.stderr  # an error finding, as `diagnose` says
    out = proc.stdout
    table = out.split("\nranks")[1].split("\ngroups")[0]
    rows = {int(line.split()[0]): line for line in table.splitlines()
            if "│" in line and line.split()[0].isdigit()}
    assert set(rows) == {0, 1, 2, 3}, out
    for r in (0, 1, 2):  # waiting in the all_reduce past the hang timeout
        assert "hung" in rows[r] and "all_reduce #2" in rows[r], rows[r]
    assert "running" in rows[3] and "outside collectives" in rows[3], rows[3]
    # where it is stuck: the line of its stack (the owner's py-spy), not its last collective
    stuck = marker_lines("bugs/stuck_outside.py")["stuck"]
    assert f"stuck_outside.py:{stuck}" in rows[3], rows[3]
    assert "in wait_for_shard_on_nfs" in rows[3], rows[3]
    assert "4/4" in out
    hang_rows = [line.split("│") for line in out.split("\nfindings")[1].splitlines()
                 if "│" in line and "HANG" in line]
    assert hang_rows and hang_rows[0][2].strip() == "3", out  # the culprit's column


@pytest.mark.timeout(150)
def test_dashboard_draws_ranks_groups_and_the_finding(hung_job):
    from distdoctor.tui.app import WatchApp

    live = LiveDiagnosis(hung_job, HANG_TIMEOUT_S, owner=False).start()
    app = WatchApp(SnapshotTaker(live), refresh_s=0.2)

    async def drive():
        async with app.run_test(size=(180, 50)) as pilot:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                await pilot.pause(0.2)
                snap = app.snapshot
                if snap and len(snap.ranks) == 4 and any(f.kind == "hang" for f in snap.findings):
                    break
            ranks = app.query_one("#ranks")
            assert ranks.row_count == 4
            assert [ranks.get_row_at(i)[0].plain for i in range(4)] == ["0", "1", "2", "3"]
            states = {ranks.get_row_at(i)[2].plain for i in range(3)}
            assert states == {"hung"}, states
            assert ranks.get_row_at(3)[0].style == "bold red"  # the culprit
            findings = app.query_one("#findings")
            kinds = [findings.get_row_at(i)[1].plain for i in range(findings.row_count)]
            assert "HANG" in kinds, kinds
            await pilot.press("f")
            findings.move_cursor(row=kinds.index("HANG"))
            await pilot.pause(0.1)
            detail = str(app.query_one("#detail").render())
            assert "stuck_outside.py" in detail and "try:" in detail, detail
            await pilot.press("r")
            ranks.move_cursor(row=0)
            await pilot.pause(0.1)
            detail = str(app.query_one("#detail").render())
            assert "rank 0" in detail and "all_reduce #2 in 0" in detail, detail
            assert "in flight" in detail and "ok" in detail, detail  # #2 waits, #0-1 done
            groups = app.query_one("#groups")
            assert groups.get_row_at(0)[0].plain.startswith("0")
            await pilot.press("p")
            assert app.paused
            await pilot.press("q")

    try:
        asyncio.run(drive())
    finally:
        live.leave()


@pytest.mark.timeout(60)
def test_watch_refuses_bad_input_in_one_line(tmp_path):
    cases = [
        (["watch", str(tmp_path / "missing"), "--once"], "does not exist"),
        (["watch", str(tmp_path), "--once"], "not a distdoctor run directory"),
        (["watch", str(tmp_path), "--backlog", "-1", "--once"], "--backlog"),
        (["watch", str(tmp_path)], "needs a terminal"),  # CI: no terminal
    ]
    for args, words in cases:
        proc = run_cli(args, timeout=30)
        assert proc.returncode == 2, (args, proc.stderr)
        assert words in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "watch" in run_cli(["--help"], timeout=30).stdout


def _state(run_dir: Path) -> dict:
    return {str(p.relative_to(run_dir)): (p.stat().st_mtime_ns, p.stat().st_size)
            for p in sorted(run_dir.rglob("*"))}


@pytest.mark.timeout(120)
def test_a_viewer_changes_nothing_in_the_run_dir(tmp_path):
    from distdoctor.tui.app import WatchApp

    run_dir = tmp_path / "run"
    assert run_job("many_ops.py", 2, run_dir, "20").returncode == 0
    before = _state(run_dir)
    proc = run_cli(["watch", str(run_dir), "--once"], timeout=60)
    assert proc.returncode == 0 and "finished" in proc.stdout, proc.stderr
    assert "exited with code 0" in proc.stdout
    live = LiveDiagnosis(run_dir, 60, owner=False).start()
    app = WatchApp(SnapshotTaker(live), refresh_s=0.1)

    async def drive():
        async with app.run_test(size=(160, 40)) as pilot:
            await pilot.pause(1.0)
            assert app.query_one("#ranks").row_count == 2
            await pilot.press("q")

    try:
        asyncio.run(drive())
    finally:
        live.leave()
    assert _state(run_dir) == before
