"""Issue 24's classes beyond what the corpus (tests/logcorpus.py) judges: each rule on a log
changed the way real logs differ (a report cut, a launcher's lines missing, a WARN that
recovered), healthy look-alikes quiet, and bad input never a traceback."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from logtests import warned_of

from distdoctor.logs import scan_logs
from distdoctor.logs.lines import parse_line
from tests.conftest import run_cli

LOGS = Path(__file__).parent / "fixtures" / "logs"
_NCCL_HEAD = re.compile(r"[\w.-]+:\d+:\d+ \[\d+\] ")  # NCCL's own lines, not torch's


def _scan(path: Path) -> list:
    return scan_logs([str(path)])[0]


def _write(tmp_path: Path, text: str, name: str = "job.log") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


def test_quoted_lines_are_peeled_at_every_depth():
    for quoted in ("> [rank3]: RuntimeError: boom", ">> [rank3]: RuntimeError: boom",
                   "> > [rank3]: RuntimeError: boom", ">[rank3]: RuntimeError: boom"):
        line = parse_line(quoted)
        assert line.rank == 3 and line.text == "RuntimeError: boom", quoted
    assert parse_line("> ").text == ""


def test_a_nccl_warn_whose_error_climbs_back_is_an_error_with_its_cause(tmp_path):
    """The topology WARN and its "-> 2" lines alone (the torch error cut off) still make an
    error finding with the cause and the remedy."""
    text = (LOGS / "source" / "nccl_topo_sysfs_container.log").read_text()
    kept = "\n".join(ln for ln in text.splitlines() if _NCCL_HEAD.match(ln) or not ln.strip())
    (f,) = warned_of(_scan(_write(tmp_path, kept + "\n")))
    assert f.severity == "error" and f.details["rule"] == "topology"
    assert "Could not find real path" in f.summary and "ncclSystemError" in f.summary
    assert "/sys" in f.remedy


def test_a_warn_chain_the_process_recovered_from_is_quiet(tmp_path):
    """A WARN with "-> 2" after it, then the same process finishes its init: NCCL found
    another way (a successful retry): no error, no warning."""
    text = (LOGS / "source" / "nccl_topo_sysfs_container.log").read_text()
    kept = [ln for ln in text.splitlines() if _NCCL_HEAD.match(ln) and "init.cc:1396" not in ln]
    kept += ["c0ffee7a1b2c:512:601 [0] NCCL INFO ncclCommInitRank comm 0x1 rank 0 nranks 2 "
             "cudaDev 0 busId 1e0 - Init COMPLETE",
             "c0ffee7a1b2c:513:602 [1] NCCL INFO ncclCommInitRank comm 0x2 rank 1 nranks 2 "
             "cudaDev 1 busId 1f0 - Init COMPLETE", "epoch 1 loss 0.51", "training done"]
    assert warned_of(_scan(_write(tmp_path, "\n".join(kept) + "\n"))) == []


def test_a_warn_with_no_chain_after_it_is_not_an_error(tmp_path):
    text = ("gpu-7:100:200 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.7<0>\n\n"
            "gpu-7:100:200 [0] misc/utils.cc:116 NCCL WARN Could not find real path of "
            "/sys/class/net/eth0/device\n"
            "gpu-7:100:200 [0] NCCL INFO comm 0x1 rank 0 nRanks 1 nNodes 1 localRanks 1\n"
            "step 10 loss 1.0 (no error)\n")
    assert warned_of(_scan(_write(tmp_path, text))) == []


def test_the_peer_a_victims_own_frame_names_settles_it_where_absence_cannot(tmp_path):
    """The recorded job without torchrun's report, and with rank 3 still printing: two
    ranks are neither victims nor failed, so absence names nobody; the victims' frames
    (`dist.recv(buf, 0)`) name rank 0."""
    text = (LOGS / "real" / "gloo_recv_peer_exits.log").read_text()
    ranks_only = [ln for ln in text.splitlines() if ln.startswith("[rank")]
    ranks_only.append("[rank3]: step 2 done")
    (f,) = warned_of(_scan(_write(tmp_path, "\n".join(ranks_only) + "\n")))
    assert f.ranks == [0] and "dist.recv(buf, 0)" in f.summary, f.summary
    assert {c["rank"] for c in f.callsites} == {1, 2}
    assert all(c["file"].endswith("worker.py") for c in f.callsites)


def test_timeouts_on_a_lower_sequence_number_name_the_rank_behind_without_pg_status(tmp_path):
    text = (LOGS / "source" / "watchdog_pg_status_desync.log").read_text()
    text = re.sub(r" PG status: last enqueued work: \d+, last completed work: \d+", "", text)
    found = warned_of(_scan(_write(tmp_path, text)))
    assert len(found) == 1 and found[0].ranks == [2], [f.summary for f in found]
    assert "SeqNum 87" in found[0].summary and "86" in found[0].summary


def test_the_new_watchdog_wording_carries_the_pg_status():
    found = _scan(LOGS / "source" / "watchdog_pg_status_behind.log")
    top = warned_of(found)[0]
    assert top.ranks == [2] and top.seq == 1116
    assert "last enqueued work 1115" in top.summary
    assert sorted(top.details["reporting_ranks"]) == [0, 1, 3]


def test_a_device_assert_without_any_traceback_still_names_the_rank(tmp_path):
    """Only the kernel's assert lines (no rank prefix) and torchrun's report of the rank
    that aborted: the assert is that rank's, with what it checks."""
    text = ("../aten/src/ATen/native/cuda/Indexing.cu:1236: indexSelectLargeIndex: block: "
            "[201,0,0], thread: [64,0,0] Assertion `srcIndex < srcSelectDimSize` failed.\n"
            "E0101 00:00:00.000000 77 torch/distributed/elastic/multiprocessing/api.py:869] "
            "failed (exitcode: -6) local_rank: 6 (pid: 91) of binary: /usr/bin/python\n")
    (f,) = warned_of(_scan(_write(tmp_path, text)))
    assert f.ranks == [6] and f.kind == "crash"
    assert "srcIndex < srcSelectDimSize" in f.summary and "vocabulary" in f.summary
    assert "CUDA_LAUNCH_BLOCKING" in f.remedy


def test_cuda_error_words_in_ordinary_sentences_stay_quiet(tmp_path):
    text = ("preflight: no CUDA error: all 8 devices answered.\n"
            "[W501 10:00:00.000 x.py:1] retried once after CUDA error: launch timed out\n"
            "docs: see 'CUDA error: device-side assert' in the FAQ? no, all good\n"
            "step 100 loss 0.1\n")
    found = warned_of(_scan(_write(tmp_path, text)))
    assert [f for f in found if f.severity == "error"] == [], [f.summary for f in found]


def test_a_store_retry_warning_alone_stays_quiet_but_a_give_up_is_fatal(tmp_path):
    retry = ("[W socket.cpp:436] [c10d] The server socket has failed to bind to [::]:29500 "
             "(errno: 98 - Address already in use).\nstep 1 loss 2.0\nstep 2 loss 1.9\n")
    assert warned_of(_scan(_write(tmp_path, retry))) == []
    (f,) = warned_of(_scan(LOGS / "source" / "store_listen_failed_traceback.log"))
    assert f.severity == "error" and "went on" not in f.summary and "29500" in f.summary


def test_an_exit_the_launcher_reports_by_local_rank_on_another_node_is_not_that_rank():
    found = _scan(LOGS / "source" / "cuda_unspecified_launch_failure.log")
    assert [f.ranks for f in warned_of(found)] == [[14]], [f.summary for f in found]


@pytest.mark.parametrize("junk", [
    "CUDA error: \nCUBLAS_STATUS_\nAssertion `\nNCCL INFO -> \nNCCL WARN \n-> 99999999999\n",
    "> > > > >\n>\n" * 50 + "failure detected by watchdog at work sequence id: x\n",
    "  time      : 9999-99-99_99:99:99\n  rank      : 1 (local_rank: 1)\nRoot Cause (first "
    "observed failure):\n  rank      : 2\n  time      :\n",
])
def test_bad_input_never_gives_a_traceback(tmp_path, junk):
    path = _write(tmp_path, junk)
    _scan(path)  # no exception
    proc = run_cli(["diagnose", "--log", str(path), "--json"], timeout=60)
    assert proc.returncode in (0, 1) and "Traceback" not in proc.stderr
    json.loads(proc.stdout)


def test_gloo_receiving_more_than_it_posted_is_a_mismatch_that_blames_no_receiver():
    """Real output of torch 2.9.1 (tests/fixtures/logs/other_torch/README.md): the C++
    enforce text, unprefixed, is why rank 1 aborted. Rank 1 *received* the oversized
    message: where the mismatch was seen, not its cause (the sender's op, or its own, had
    another size), so no culprit is named; one finding, not a mismatch and a crash."""
    found = warned_of(_scan(LOGS / "other_torch" / "torch2.9.1_pipelining_gloo_size_mismatch.log"))
    assert [(f.kind, f.ranks) for f in found] == [("mismatch", [])], found
    assert found[0].details["received_on"] == [1]
    assert "8 bytes arrived for a 4-byte buffer" in found[0].summary
    assert "rank 1 received it and aborted" in found[0].summary
