"""Communication errors from logs: recorded Gloo/c10d logs, NCCL message formats, the live
scanner under `distdoctor run`, and bad input for `diagnose --log`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from distdoctor.diagnosis.logscan import MAX_PROBLEMS, LogScanner, scan_lines, scan_log
from distdoctor.errors import UserError
from tests.conftest import run_cli, run_job

LOGS = Path(__file__).parent / "fixtures" / "logs"


def _by_rule(findings):
    return {f.details.get("rule", f.details.get("signature")): f for f in findings}


def test_gloo_peer_death_blames_the_rank_that_exited_not_the_one_that_saw_it():
    found = _by_rule(scan_log(str(LOGS / "gloo_peer_died.log")))
    lost = found["gloo_peer_gone"]
    assert lost.kind == "comm_error" and lost.ranks == []  # rank 0 suffered it
    assert lost.details["reporting_ranks"] == [0]
    crash = found["torchrun_root_cause"]
    assert crash.kind == "crash" and crash.severity == "error" and crash.ranks == [1]
    assert "exited with code 3" in crash.summary


def test_gloo_timeout_names_the_rank_that_never_arrived():
    found = _by_rule(scan_log(str(LOGS / "gloo_rank_skipped.log")))
    timeout = found["gloo_timeout"]
    assert timeout.ranks == [1] and timeout.details["reporting_ranks"] == [0]
    assert "after 3 s" in timeout.summary and "never arrived" in timeout.summary
    # torchrun calls rank 0 the root cause: it is where the timeout surfaced, not the culprit
    crash = found["torchrun_root_cause"]
    assert crash.severity == "warning" and crash.ranks == []


@pytest.mark.parametrize("log, rule, words", [
    ("store_join_timeout.log", "store_join_timeout", "1 of 2 ranks joined"),
    ("store_port_in_use.log", "store_port_in_use", "port 29623 is already in use"),
    ("store_client_timeout.log", "store_client_timeout", "127.0.0.1:29624"),
])
def test_c10d_store_failures(log, rule, words):
    found = scan_log(str(LOGS / log))
    assert [f.details["rule"] for f in found] == [rule]
    assert words in found[0].summary and found[0].remedy


def test_nccl_watchdog_timeout_one_finding_for_all_ranks_and_the_silent_rank_is_named():
    found = _by_rule(scan_log(str(LOGS / "nccl_job.log")))
    t = found["nccl_watchdog_timeout"]
    assert t.severity == "error" and t.ranks == [3]
    assert t.details["reporting_ranks"] == [0, 1, 2] and t.details["count"] == 3
    assert (t.seq, t.group, t.details["op"]) == (1042, "0", "ALLREDUCE")
    assert t.details["group_desc"] == "default_pg"
    assert t.details["numel_in"] == 1048576 and t.details["timeout_ms"] == 600000
    assert "TORCH_NCCL_DUMP_ON_TIMEOUT" in t.remedy
    # the two identical NCCL WARN socket lines are one problem
    assert found["nccl_warn_socket"].details["count"] == 2
    assert "NCCL_SOCKET_IFNAME" in found["nccl_warn_socket"].remedy


def test_nccl_init_failures_map_to_their_remedies():
    found = _by_rule(scan_log(str(LOGS / "nccl_init.log")))
    assert found["nccl_duplicate_gpu"].ranks == [0, 1]
    assert "set_device" in found["nccl_duplicate_gpu"].remedy
    assert found["nccl_system_error"].ranks == [2]
    assert "NCCL_IB_DISABLE" in found["nccl_system_error"].remedy
    assert "shm-size" in found["nccl_warn_shm"].remedy


def test_timeout_without_a_silent_rank_says_the_culprit_is_unknown():
    line = ("[rank0]:[E1122 09:22:03.412000 4101 ProcessGroupNCCL.cpp:632] [Rank 0] Watchdog "
            "caught collective operation timeout: WorkNCCL(SeqNum=7, OpType=BROADCAST, "
            "NumelIn=4, NumelOut=4, Timeout(ms)=1000) ran for 1002 milliseconds before timing "
            "out.")
    (f,) = scan_lines([line])
    assert f.ranks == [] and "not named in this log" in f.summary


def test_live_scanner_updates_one_finding_as_ranks_report():
    scanner = LogScanner()
    scanner.ranks_seen.update({0, 1, 2})
    msg = ("Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, OpType=ALLREDUCE, "
           "NumelIn=1, NumelOut=1, Timeout(ms)=1000) ran for 1001 milliseconds before timing out")
    (first,) = scanner.feed(msg, rank=0)
    assert first.ranks == [1, 2]
    (second,) = scanner.feed(msg, rank=1)
    assert second.ranks == [2] and second.details["signature"] == first.details["signature"]
    assert scanner.feed("loss 2.31", rank=2) == []  # ordinary output: nothing new


def test_scanner_is_bounded_and_ignores_ordinary_output():
    scanner = LogScanner()
    for i in range(MAX_PROBLEMS + 50):
        scanner.feed(f"host:1:1 [0] NCCL WARN novel problem {'x' * (i % 7)} {chr(65 + i % 26)}"
                     f"{chr(65 + i // 26 % 26)}", rank=0)
    assert len(scanner.findings()) <= MAX_PROBLEMS and scanner.dropped > 0
    assert scan_lines(["step 1 loss 2.3", "x" * 100_000, "\x00\xff garbage"]) == []


def test_diagnose_log_bad_input_is_one_line(tmp_path):
    missing = run_cli(["diagnose", "--log", str(tmp_path / "nope.log")], timeout=60)
    assert missing.returncode == 2 and "not found" in missing.stderr
    assert "Traceback" not in missing.stderr and len(missing.stderr.strip().splitlines()) == 1
    with pytest.raises(UserError):
        scan_log(str(tmp_path))  # a directory
    binary = tmp_path / "core"
    binary.write_bytes(bytes(range(256)) * 4096)
    res = run_cli(["diagnose", "--log", str(binary), "--json"], timeout=60)
    assert res.returncode == 0 and json.loads(res.stdout)["findings"] == []


def test_diagnose_log_json_and_exit_code():
    res = run_cli(["diagnose", "--log", str(LOGS / "gloo_rank_skipped.log"), "--json"],
                  timeout=60)
    assert res.returncode == 1, res.stderr  # an error-severity finding
    out = json.loads(res.stdout)
    assert {f["kind"] for f in out["findings"]} == {"comm_error", "crash"}
    assert out["sources"] == [f"log {LOGS / 'gloo_rank_skipped.log'}"]


@pytest.mark.timeout(150)
def test_live_run_scans_output_and_passes_it_through_unchanged(tmp_path):
    run_dir = tmp_path / "run"
    res = run_job("gloo_timeout.py", 2, run_dir, timeout=120)
    assert res.returncode != 0
    # the job's output, unchanged: non-ASCII, stderr on stderr, a `\r` progress line
    # (run_cli decodes without newline translation, so the `\r` is still there)
    for rank in (0, 1):
        assert f"marker-out rank {rank} \u00e9\n" in res.stdout
        assert f"marker-err rank {rank}\n" in res.stderr
        assert f"progress {rank} 50%\rprogress {rank} 100%\n" in res.stdout
    found = json.loads((run_dir / "findings.json").read_text())["findings"]
    (timeout,) = [f for f in found if f["details"].get("rule") == "gloo_timeout"]
    assert timeout["ranks"] == [1] and timeout["details"]["reporting_ranks"] == [0]
    assert "COMM_ERROR Gloo timed out" in res.stderr  # printed live
