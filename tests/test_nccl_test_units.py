"""`distdoctor nccl-test` pieces that need no second process: the table and its JSON/CSV
twins, split and pairwise analysis, the NVLink peak, and the one-line errors of bad input
(the formulas and the correctness check are in test_nccl_test_formulas.py)."""

from __future__ import annotations

import io
import json
import sys

import pytest

from distdoctor.cli import main as cli_main
from distdoctor.errors import UserError
from distdoctor.nccltest import pairwise, pairwise_report, report, split
from distdoctor.nccltest.options import Options
from distdoctor.nccltest.results import OpReport, PlaceResult, RankInfo, Row

# --- table and machine-readable twins ---------------------------------------------------

NCCL_TESTS_HEADER = [
    "#                                                              out-of-place          "
    "             in-place          ",
    "#       size         count      type   redop    root     time   algbw   busbw #wrong   "
    "  time   algbw   busbw #wrong",
    "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)         "
    "   (us)  (GB/s)  (GB/s)       ",
]


def test_column_header_matches_nccl_tests_character_for_character():
    assert report.column_header() == NCCL_TESTS_HEADER


def _row(**kw):
    oop = PlaceResult(22.4, 0.0, 0.0, 0, [22.0, 22.8])
    ip = PlaceResult(21.91, 0.0, 0.0, 0, [21.0, 22.82])
    base = dict(op="all_reduce", size=8, count=2, dtype="float", redop="sum", root=-1,
                nranks=2, oop=oop, ip=ip)
    base.update(kw)
    return Row(**base)


def test_row_matches_an_nccl_tests_line():
    line = "           8             2     float     sum      -1    22.40    0.00    0.00" \
           "      0    21.91    0.00    0.00      0"
    assert report.format_row(_row()) == line


def test_row_time_precision_and_na_columns():
    big = PlaceResult(123456.0, 8.7, 15.2, 0, [123456.0])
    mid = PlaceResult(512.34, 1.0, 1.0, None, [512.34])
    line = report.format_row(_row(size=1 << 30, count=1 << 28, oop=None, ip=big))
    assert line.split()[5:] == ["N/A", "N/A", "N/A", "N/A", "123456", "8.70", "15.20", "0"]
    assert report.format_row(_row(ip=mid)).split()[-4:] == ["512.3", "1.00", "1.00", "N/A"]


def _ranks(n=2, hosts=None):
    hosts = hosts or ["h"] * n
    return [RankInfo(r, r, hosts[r], 100 + r, "cpu", "TestCPU", "-") for r in range(n)]


def _report():
    rep = OpReport("all_reduce")
    rep.rows = [_row(oop=None, ip=PlaceResult(10.0, 1.0, 1.0, 0, [9.0, 11.0])),
                _row(size=16, count=4, oop=None, ip=PlaceResult(10.0, 2.0, 3.0, 2, [9.0, 11.0]))]
    return rep


def test_footer_counts_wrong_results_and_averages_busbw():
    lines = report.footer_lines(_report(), _ranks(), Options())
    assert lines[0] == "# Out of bounds values : 1 FAILED"
    assert lines[1] == "# Avg bus bandwidth    : 2 "


def test_json_twin_holds_every_number_of_the_table():
    data = report.to_json(Options(), _ranks(), "gloo", [_report()])
    json.dumps(data)  # serialisable
    assert data["format"] == "distdoctor.nccl-test" and data["ok"] is False
    test = data["tests"][0]
    assert test["op"] == "all_reduce" and test["out_of_bounds"] == 1
    assert test["busbw_factor"] == pytest.approx(1.0)
    second = test["results"][1]
    assert second["out_of_place"] is None
    assert second["in_place"] == {"time_us": 10.0, "algbw_gbps": 2.0, "busbw_gbps": 3.0,
                                  "wrong": 2, "rank_time_us": [9.0, 11.0]}


def test_csv_twin_has_one_line_per_row_and_blank_na_cells():
    out = io.StringIO()
    report.write_csv([_report()], out)
    lines = out.getvalue().splitlines()
    assert lines[0].split(",") == report.CSV_COLUMNS
    assert len(lines) == 3
    assert lines[1].split(",")[7:11] == ["", "", "", ""]


def test_split_groups_summary_flags_the_slow_group():
    rep = OpReport("all_reduce")
    from distdoctor.nccltest.results import GroupResult
    groups = [GroupResult(g, [g, g + 3], 1.0, bw, bw) for g, bw in enumerate([10.0, 9.0, 2.0])]
    rep.rows = [_row(oop=None, ip=PlaceResult(1.0, 7.0, 7.0, 0, [1.0] * 6, groups))]
    ranks = _ranks(6)
    for r in ranks:
        r.group = r.rank % 3
    lines = report.split_lines(rep, ranks, Options(split="MOD 3"))
    assert "SLOW" in lines[3] and "Group  2" in lines[3]
    assert not any("SLOW" in line for line in lines[1:3])


# --- split ------------------------------------------------------------------------------

def test_split_rules_match_nccl_tests_split():
    hosts = ["a", "a", "a", "a", "b", "b", "b", "b"]
    assert split.groups(split.parse_split("node"), hosts) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert split.groups(split.parse_split("rail"), hosts) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert split.groups(split.parse_split("MOD 4"), hosts) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert split.groups(split.parse_split("DIV 4"), hosts) == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert split.groups(split.parse_split("AND 0x3"), hosts) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert split.groups(split.parse_split("0x3"), hosts) == [[0, 4], [1, 5], [2, 6], [3, 7]]


def test_split_refuses_uneven_groups_and_bad_rules():
    with pytest.raises(UserError, match="unequal"):
        split.groups(split.parse_split("node"), ["a", "a", "a", "b"])
    with pytest.raises(UserError, match="NCCL_TESTS_SPLIT"):
        split.parse_split("every other")


# --- pairwise ---------------------------------------------------------------------------

@pytest.mark.parametrize("n", [2, 3, 4, 7, 8])
@pytest.mark.parametrize("serial", [True, False])
def test_pairwise_schedule_covers_every_pair_once_in_disjoint_rounds(n, serial):
    rounds = pairwise.schedule(n, serial)
    pairs = [p for rnd in rounds for p in rnd]
    assert sorted(pairs) == [(a, b) for a in range(n) for b in range(a + 1, n)]
    for rnd in rounds:
        members = [r for p in rnd for r in p]
        assert len(members) == len(set(members))


def test_send_delay_hook_parsing():
    assert pairwise.send_delays("2:30, 5:10") == {2: 0.03, 5: 0.01}
    assert pairwise.send_delays(None) == {}
    with pytest.raises(UserError):
        pairwise.send_delays("slow")


def _matrices(n, slow_sender=None, noisy=None):
    bw = [[0.0 if s == d else 10.0 for d in range(n)] for s in range(n)]
    lat = [[0.0 if a == b else 5.0 for b in range(n)] for a in range(n)]
    if slow_sender is not None:
        for d in range(n):
            if d != slow_sender:
                bw[slow_sender][d] = 0.5
    if noisy:
        bw[noisy[0]][noisy[1]] = 4.0
    return bw, lat


def test_pairwise_analysis_names_the_slow_sender_and_its_host():
    ranks = _ranks(4, ["n0", "n0", "n1", "n1"])
    bw, lat = _matrices(4, slow_sender=2, noisy=(0, 3))
    result = pairwise_report.analyze(bw, lat, ranks, 0.7, 1 << 20, 5)
    assert {(p["src"], p["dst"]) for p in result["slow_pairs"]} == {(2, 0), (2, 1), (2, 3),
                                                                    (0, 3)}
    # the noisy 0 -> 3 and the slow 2 -> 3 do not make rank 3 a suspect
    assert [(s["rank"], s["reasons"]) for s in result["suspects"]] == [
        (2, ["all 3 of its sends are slow"])]
    text = "\n".join(pairwise_report.format_lines(result, ranks))
    assert "Suspect: rank 2 (n1 cpu)" in text and "2 -> 0" in text


def test_pairwise_analysis_of_a_healthy_matrix_flags_nothing():
    bw, lat = _matrices(4)
    result = pairwise_report.analyze(bw, lat, _ranks(4), 0.7, 1 << 20, 5)
    assert result["slow_pairs"] == [] and result["suspects"] == []
    assert report.outcome_ok([], result)


# --- CLI: bad input is one line and a non-zero exit, before any rank starts -----------------

@pytest.mark.parametrize("argv,fragment", [
    (["nccl-test", "allreduce_bogus"], "unknown op 'allreduce_bogus'"),
    (["nccl-test", "-d", "float7"], "unknown datatype 'float7'"),
    (["nccl-test", "-b", "2M", "-e", "1M"], "minbytes 2097152 > maxbytes 1048576"),
    (["nccl-test", "-o", "mulsum"], "unknown reduction op 'mulsum'"),
    (["nccl-test", "-a", "4"], "-a/--average"),
    (["nccl-test", "-r", "first"], "-r/--root"),
    (["nccl-test", "--split", "diagonal"], "invalid --split"),
    (["nccl-test", "--nproc", "0"], "--nproc must be at least 1"),
    (["nccl-test", "--pairwise", "--split", "node"], "do not combine"),
    (["nccl-test", "-G", "2", "--backend", "gloo"], "-G/--cudagraph"),
    (["nccl-test", "-b", "1K", "-e", "1K", "--plot", "out.svg"], "ending in .png"),
])
def test_bad_input_is_one_line(argv, fragment, capsys):
    code = cli_main(argv)
    err = capsys.readouterr().err
    assert code != 0
    assert fragment in err and err.count("\n") == 1 and "Traceback" not in err


def test_plot_without_matplotlib_says_so_in_one_line(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError
    code = cli_main(["nccl-test", "-b", "1K", "-e", "1K", "--plot", "bw.png"])
    err = capsys.readouterr().err
    assert code == 2 and "--plot needs matplotlib" in err and err.count("\n") == 1


def test_nproc_under_torchrun_is_refused(capsys, monkeypatch):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert cli_main(["nccl-test", "--nproc", "2", "-b", "1K", "-e", "1K"]) == 2
    assert "under torchrun" in capsys.readouterr().err


def test_help_lists_nccl_tests_options(capsys):
    with pytest.raises(SystemExit):
        cli_main(["nccl-test", "--help"])
    out = capsys.readouterr().out
    for flag in ["-b", "--minbytes", "-e", "-f", "-i", "-n", "-w", "-c", "-d", "-o", "-r",
                 "-z", "-a", "-G", "--nproc", "--backend", "--json", "--csv", "--plot",
                 "--pairwise", "--split"]:
        assert flag in out


# --- NVLink peak from NVML (a stand-in NVML: no GPU here) ----------------------------------

class _FakeNVML:
    NVML_NVLINK_MAX_LINKS = 18
    NVML_FEATURE_ENABLED = 1

    class NVMLError(Exception):
        pass

    def __init__(self, active_links, version_code):
        self.active, self.code, self.calls = active_links, version_code, []

    def nvmlInit(self):
        self.calls.append("init")

    def nvmlShutdown(self):
        self.calls.append("shutdown")

    def nvmlDeviceGetHandleByPciBusId(self, bus_id):
        self.calls.append(bus_id)
        return "handle"

    def nvmlDeviceGetNvLinkState(self, handle, link):
        if link >= 12 and self.active <= 12:
            raise self.NVMLError("not supported")
        return 1 if link < self.active else 0

    def nvmlDeviceGetNvLinkVersion(self, handle, link):
        return self.code


@pytest.mark.parametrize("active,code,peak,note", [
    (18, 6, 450.0, "NVLink 4.0 x 18 links"),  # H100 SXM
    (12, 5, 300.0, "NVLink 3.1 x 12 links"),  # A100 SXM reports the enum 5, not 3
    (18, 7, 900.0, "NVLink 5.0 x 18 links"),  # B200
])
def test_nvlink_peak_reads_the_version_enum_and_counts_active_links(monkeypatch, active, code,
                                                                      peak, note):
    from distdoctor.nccltest import peak as peak_mod
    fake = _FakeNVML(active, code)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    gbps, how = peak_mod.nvlink_peak(peak_mod.nvml_bus_id(0, 0x1B, 0))
    assert gbps == peak and how.startswith(note)
    assert fake.calls == ["init", "00000000:1B:00.0", "shutdown"]


def test_nvlink_peak_is_a_value_not_an_error_without_nvlink_or_nvml(monkeypatch):
    from distdoctor.nccltest import peak as peak_mod
    fake = _FakeNVML(0, 6)
    fake.nvmlDeviceGetHandleByIndex = lambda index: "handle"
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    assert peak_mod.nvlink_peak(None) == (None, "no active NVLink (PCIe only)")
    monkeypatch.setitem(sys.modules, "pynvml", None)
    gbps, why = peak_mod.nvlink_peak("00000000:1B:00.0")
    assert gbps is None and "NVML not available" in why


def test_header_and_footer_show_the_nvlink_peak_when_every_rank_shares_a_host():
    ranks = _ranks(2)
    for r in ranks:
        r.device, r.bus_id, r.peak_gbps, r.peak_note = f"cuda:{r.rank}", "-", 450.0, "NVLink 4.0"
    header = report.header_lines(Options(), ranks, "nccl")
    assert "#  NVLink peak on h: 450 GB/s per GPU per direction (NVLink 4.0)" in header
    rep = OpReport("all_reduce")
    rep.rows = [_row(oop=None, ip=PlaceResult(1.0, 240.0, 360.0, 0, [1.0, 1.0]))]
    footer = report.footer_lines(rep, ranks, Options())
    assert "# NVLink peak          : 450 GB/s; avg bus bandwidth is 80% of it" in footer
    ranks[1].host = "other"  # across hosts the network, not NVLink, bounds busbw
    assert not any("NVLink" in line for line in report.footer_lines(rep, ranks, Options()))


def test_what_other_ranks_said_is_printed_as_text():
    """A rank's host and device names reach the table as they said them: as text."""
    out = io.StringIO()
    report.print_lines(["#  Rank  1 Group  0 Pid   4242 on vm\x1b[2J\x1b]0;owned\x07 device cpu"],
                       out)
    assert "\x1b" not in out.getvalue() and "\x07" not in out.getvalue()
    assert "on vm" in out.getvalue()
