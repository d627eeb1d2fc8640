"""The dashboard's pieces without a terminal: probe-file tailing, cell wording and colour,
the ranks' GPU column from (replayed, and labelled so) NVML readings."""

from __future__ import annotations

import json

from distdoctor.probes.sampler import SampleTail, samples_path
from distdoctor.tui import cells
from test_probes_sampler_throttle import replayed_run

from distdoctor.findings import Finding
from distdoctor.views.probe_columns import with_probes
from distdoctor.views.rank import RankRow
from distdoctor.views.snapshot import JobSnapshot, OpRow


def _row(rank: int, **kw) -> RankRow:
    base = dict(rank=rank, host="h", pid=1, state="running", where="outside collectives",
                callsite="train.py:9", last_done="all_reduce #3 (0)", collectives=4,
                rate=2.0, span="step 2", lateness_ms=None)
    return RankRow(**{**base, **kw})


def test_tail_reads_only_complete_new_lines_and_follows_rotation(tmp_path):
    samples = replayed_run(tmp_path, "h100_hw_thermal")
    tail = SampleTail(tmp_path)
    assert [s.t for s in tail.read_new()] == [s.t for s in samples]
    assert tail.read_new() == []
    path = samples_path(tmp_path)
    line = json.dumps(samples[-1].to_json() | {"t": samples[-1].t + 1})
    with open(path, "a") as f:
        f.write(line[:40])  # the sampler is mid-write
    assert tail.read_new() == []
    with open(path, "a") as f:
        f.write(line[40:] + "\n")
    assert [s.t for s in tail.read_new()] == [samples[-1].t + 1]
    path.rename(path.with_name(path.name + ".1"))  # rotation: a new, shorter file
    path.write_text(json.dumps({"format": "distdoctor-probes", "version": 1}) + "\n"
                    + json.dumps(samples[0].to_json()) + "\n")
    assert [s.t for s in tail.read_new()] == [samples[0].t]


def test_tail_starts_near_the_end_of_a_long_file(tmp_path, monkeypatch):
    samples = replayed_run(tmp_path, "h100_hw_thermal")
    size = samples_path(tmp_path).stat().st_size
    monkeypatch.setattr(SampleTail, "FIRST_READ_BYTES", size // 4)
    got = SampleTail(tmp_path).read_new()
    assert 0 < len(got) < len(samples)
    assert got[-1].t == samples[-1].t  # the newest, whole; the cut first line dropped


def test_gpu_column_comes_from_the_rank_gpu_and_says_replayed(tmp_path):
    samples = replayed_run(tmp_path, "h100_hw_thermal")
    rows = with_probes([_row(6), _row(7)], samples)
    assert rows[0].gpu.startswith("89 C 1155 MHz") and rows[0].gpu.endswith("(replayed)")
    assert rows[1].gpu and "(replayed)" in rows[1].gpu
    assert with_probes([_row(6)], []) == [_row(6)]  # no probes: unchanged


def test_cells_colour_culprits_late_ranks_and_states():
    cells_ = cells.rank_cells(_row(3, state="hung", lateness_ms=12.5), culprits={3})
    assert cells_[0].style == "bold red"
    assert cells_[2].plain == "hung" and cells_[2].style == "bold red"
    assert cells_[8].plain == "+12.5" and "yellow" in str(cells_[8].style)
    calm = cells.rank_cells(_row(1, lateness_ms=-40.0), culprits={3})
    assert calm[0].style == "bold" and calm[8].style == "dim"
    assert cells.rank_ranges([7, 0, 1, 2, 3, 5, 8]) == "0-3, 5, 7-8"
    assert cells.rank_ranges([]) == ""


def test_header_counts_findings_by_severity():
    snap = JobSnapshot("/r", "python train.py", 8, "running", 75.0, [_row(0)], [],
                       [Finding("hang", "error", "h", [3]),
                        Finding("straggler", "warning", "s", [5]),
                        Finding("straggler", "warning", "s", [6])], 1234)
    text = cells.header_line(snap).plain
    assert "ranks 1/8 (1 alive)" in text and "up 0:01:15" in text and "events 1,234" in text
    assert "1 error" in text and "2 warning" in text
    detail = cells.finding_detail(Finding("hang", "error", "rank 3 never joined", [3], "0", 7,
                                          [{"rank": 3, "file": "/a/t.py", "line": 9}],
                                          {"3": "frame"}, remedy="look"))
    assert "group 0, seq 7" in detail.plain and "rank 3: /a/t.py:9" in detail.plain
    assert "try: look" in detail.plain and "stack of rank 3" in detail.plain


def test_rank_detail_lists_its_newest_ops_with_their_outcome():
    ops = [OpRow(7, "all_reduce", "0", 3, "float32[64]", "ok", 14.25, "t.py:21"),
           OpRow(8, "broadcast", "1", 0, "int64[2]", "error", 2.0, "t.py:30"),
           OpRow(9, "all_reduce", "0", 4, "float32[64]", "in_flight", 10104.6, "t.py:21")]
    text = cells.rank_detail(_row(2, state="hung", where="all_reduce #4 in group 0"), ops)
    lines = text.plain.splitlines()
    assert lines[0].startswith("rank 2  h  pid 1  hung")
    assert "#7" in lines[2] and "ok 14.2 ms" in lines[2] and "t.py:21" in lines[2]
    assert "broadcast #0 in 1" in lines[3] and "error 2.0 ms" in lines[3]
    assert "in flight 10.1 s" in lines[4]
    assert "no ops seen" in cells.rank_detail(_row(0), []).plain


def test_the_default_backlog_shrinks_per_rank_on_large_jobs():
    from distdoctor.tui.command import default_backlog

    assert default_backlog(8) == 20_000
    assert default_backlog(256) == 1_562  # 400,000 events in all
    assert default_backlog(100_000) == 1_000
    assert default_backlog(None) == 20_000


def test_the_line_column_keeps_the_line_number_of_a_long_file_name():
    cells_of = cells.rank_cells(_row(1, callsite="pipeline_parallel_schedules.py:127"), set())
    text = cells_of[cells.RANK_COLUMNS.index("line")].plain
    assert text.endswith(".py:127") and text.startswith("\u2026")
    assert len(text) == cells.RANK_WIDTHS["line"]
    short = cells.rank_cells(_row(1, callsite="train.py:9"), set())
    assert short[cells.RANK_COLUMNS.index("line")].plain == "train.py:9"


def test_rank_detail_shows_where_its_steps_go_and_why_it_is_late():
    row = _row(2, step_split="40.5 ms a step (last 10): collectives 4.4, data 34.2, "
                             "compute 1.9",
               straggler="straggler: rank 2 keeps the others waiting 32.0 ms per step "
                         "over its last 40 steps: its DataLoader takes 34.2 ms per batch")
    plain = cells.rank_detail(row, []).plain
    assert "collectives 4.4, data 34.2, compute 1.9" in plain
    assert "why late: rank 2 keeps the others waiting 32.0 ms" in plain
    assert "why late" not in cells.rank_detail(_row(0), []).plain


# --- thousands of ranks -----------------------------------------------------------------

def test_rank_ranges_say_thousands_of_ranks_in_a_few_words():
    from distdoctor.diagnosis.report import rank_ranges

    assert rank_ranges([0, 1, 2, 3, 5]) == "0-3, 5"
    most = [r for r in range(4096) if r not in (17, 2048, 2049)]
    assert rank_ranges(most, among=range(4096)) == "0-4095 except 17, 2048-2049"
    assert rank_ranges([17, 2048], among=range(4096)) == "17, 2048"  # few: named
    every_third = rank_ranges(range(0, 4096, 3), limit=40)
    assert every_third.endswith("more)") and len(every_third) < 70, every_third
    shown = [int(x) for x in every_third.split(" (")[0].split(", ")]
    left = int(every_third.split("(+")[1].split()[0])
    assert len(shown) + left == len(range(0, 4096, 3))  # nothing lost in the count


def _big_job() -> JobSnapshot:
    """4,096 ranks: 17 spins outside collectives, the others wait for it (2048-2049 past
    the hang timeout), 3000 failed."""
    state = {17: ("running", "outside collectives for 70.0 s"), 3000: ("failed", "exit 1"),
             2048: ("hung", "all_reduce #9 in group 0 for 70.0 s"),
             2049: ("hung", "all_reduce #9 in group 0 for 70.0 s")}
    rows = [_row(r, host=f"node{r // 64:03d}", state=state.get(r, ("in collective",))[0],
                 where=state.get(r, ("", "all_reduce #9 in group 0 for 0.4 s"))[1])
            for r in range(4096)]
    hang = Finding(kind="hang", severity="error", summary="hang: rank 17 never joined",
                   ranks=[17])
    return JobSnapshot(run_dir="/runs/x", command=None, world_size=4096, state="running",
                       elapsed_s=80.0, ranks=rows, groups=[], findings=[hang], events=0)


def test_the_summary_groups_4096_ranks_by_state_culprits_first():
    text = cells.state_summary(_big_job()).plain.splitlines()
    assert text[0].split() == ["culprits", "1", "ranks", "17", "(17", "on", "node000):",
                               "HANG"], text
    assert [line.split()[0] for line in text[1:]] == ["failed", "hung", "in", "running"]
    assert "4092  ranks 0-4095 except 17, 2048-2049, 3000" in text[3], text


def test_the_summary_names_an_exception_its_rank_lived_past_as_the_table_does():
    # a healthy job's logged exception: "EXCEPTION" in the table, "CRASH" in the summary
    went_on = Finding(kind="crash", severity="warning", summary="rank 0 raised RuntimeError",
                      ranks=[0], details={"source": "log", "went_on": True})
    snap = JobSnapshot(run_dir="/r", command=None, world_size=2, state="finished",
                       elapsed_s=9.0, ranks=[_row(0), _row(1)], groups=[],
                       findings=[went_on], events=0)
    text = cells.state_summary(snap).plain.splitlines()
    assert text[0].split()[-1] == cells.finding_cells(went_on)[1].plain == "EXCEPTION", text


def test_the_table_of_4096_ranks_shows_the_notable_ones_and_finds_the_rest():
    snap = _big_job()
    rows, which = cells.ranks_shown(snap)
    assert [r.rank for r in rows] == [17, 2048, 2049, 3000], which
    assert "4 notable of 4096 ranks" in which and "a: all" in which
    assert len(cells.ranks_shown(snap, show_all=True)[0]) == 4096
    found, which = cells.ranks_shown(snap, query="100-102, node063")
    assert [r.rank for r in found] == [100, 101, 102] + list(range(4032, 4096)), which
    assert [r.rank for r in cells.ranks_shown(snap, query="hung")[0]] == [2048, 2049]
    small = JobSnapshot(**{**snap.__dict__, "ranks": snap.ranks[:8]})
    assert len(cells.ranks_shown(small)[0]) == 8  # a small job: every rank, always


def big_job_dashboard(run_dir: str = "/runs/x"):
    """The dashboard app over _big_job(), its run dir named `run_dir`."""
    from distdoctor.tui.app import WatchApp

    class Taker:  # the app asks a taker for snapshots, and the live view for its path
        live = type("Live", (), {"run_dir": run_dir})()
        detail_rank = None

        def take(self):
            return _big_job()

    return WatchApp(Taker(), refresh_s=3600)


def test_the_dashboard_of_4096_ranks_draws_the_summary_and_finds_on_demand():
    import asyncio

    app = big_job_dashboard()

    async def drive():
        async with app.run_test(size=(200, 60)) as pilot:
            await pilot.pause(0.3)
            ranks = app.query_one("#ranks")
            assert ranks.row_count == 4
            assert "culprits" in str(app.query_one("#states").render())
            await pilot.press("a")
            await pilot.pause(0.1)
            assert ranks.row_count == 4096
            await pilot.press("slash", "5", "-", "7", "enter")
            await pilot.pause(0.1)
            assert ranks.row_count == 3 and app.find_text == "5-7"
            assert app.focused is ranks  # back to the table after the search
            await pilot.press("escape")
            await pilot.pause(0.1)
            assert ranks.row_count == 4096 and app.find_text == ""
            await pilot.press("q")

    asyncio.run(drive())
