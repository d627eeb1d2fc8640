"""Failures from job output (`diagnose --log`, and `run`'s live scan of it): the corpus of
logs recorded on this machine and written from PyTorch's and NCCL's message formats
(tests/fixtures/logs/*/expected.json says what is right for each), the live scanner, bad
input, and the live path under `distdoctor run`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from distdoctor.errors import UserError
from distdoctor.logs import scan_logs
from distdoctor.logs.scanner import MAX_SIGNALS, LogScanner
from tests.conftest import run_cli, run_job
from tests.logcorpus import cases, judge, specs_of

LOGS = Path(__file__).parent / "fixtures" / "logs"
CASES = cases()


def _scan(name: str) -> list:
    return scan_logs([str(LOGS / name)])[0]


def _by_rule(findings):
    return {f.details.get("rule"): f for f in findings}


@pytest.mark.parametrize("name, entry", CASES,
                         ids=[f"{n}/{e['log'] if isinstance(e['log'], str) else e['log'][0]}"
                              for n, e in CASES])
def test_corpus(name, entry):
    found, _ = scan_logs(specs_of(name, entry))
    assert judge(entry, found) == [], entry["what"]


@pytest.mark.parametrize("name, entry", CASES[::3],
                         ids=[f"{n}/{e['log'] if isinstance(e['log'], str) else e['log'][0]}"
                              for n, e in CASES[::3]])
def test_the_readers_short_anchor_list_loses_no_line_a_family_reads(name, entry):
    from distdoctor.logs.families import ROUTES

    fast, _ = scan_logs(specs_of(name, entry))
    every, _ = scan_logs(specs_of(name, entry), anchors=ROUTES)
    assert [f.to_json() for f in fast] == [f.to_json() for f in every]


def test_corpus_covers_every_family():
    families = {e["family"] for _, e in CASES}
    assert families >= {"launcher", "oom", "store", "nccl", "gloo", "mismatch", "ddp",
                        "exception", "serial_work", "startup", "healthy"}


def test_gloo_peer_death_blames_the_rank_that_exited_not_the_one_that_saw_it():
    (crash,) = _scan("gloo_peer_died.log")
    assert crash.kind == "crash" and crash.severity == "error" and crash.ranks == [1]
    assert "exited with code 3" in crash.summary
    # rank 0's "Connection reset by peer" is the consequence, folded into the cause
    (lost,) = crash.details["consequences"]
    assert lost["rule"] == "gloo_peer_gone" and lost["reporting_ranks"] == [0]


def test_a_silent_rank_the_launcher_had_to_stop_is_the_one_that_never_arrived():
    # rank 1 skipped the all_reduce and printed nothing; torchrun's report shows it was still
    # running (stopped by SIGTERM) while rank 0 timed out
    (t,) = _scan("gloo_rank_skipped.log")
    assert t.details["rule"] == "gloo_timeout" and t.ranks == [1]
    assert t.details["reporting_ranks"] == [0] and "after 3 s" in t.summary
    assert "still running when the launcher stopped" in t.summary


@pytest.mark.parametrize("log, rule, words", [
    ("store_join_timeout.log", "join_timeout", "1/2 clients joined"),
    ("store_port_in_use.log", "port_in_use", "port 29623 is already in use"),
    ("store_client_timeout.log", "connect_timeout", "127.0.0.1:29624"),
])
def test_c10d_store_failures(log, rule, words):
    (f,) = _scan(log)
    assert f.details["rule"] == rule and words in f.summary and f.remedy


def test_nccl_watchdog_timeout_one_finding_for_all_ranks_and_the_silent_rank_is_named():
    found = _by_rule(_scan("nccl_job.log"))
    t = found["watchdog_timeout"]
    assert t.kind == "hang" and t.severity == "error" and t.ranks == [3]
    assert t.details["reporting_ranks"] == [0, 1, 2]
    assert (t.seq, t.group, t.details["op"]) == (1042, "0", "ALLREDUCE")
    assert t.details["group_desc"] == "default_pg"
    assert t.details["numel_in"] == 1048576 and t.details["timeout_ms"] == 600000
    assert "TORCH_NCCL_DUMP_ON_TIMEOUT" in t.remedy
    # socket WARNs NCCL went on after are a warning, not the cause
    assert found["socket"].severity == "warning" and found["socket"].details["count"] == 2
    assert "NCCL_SOCKET_IFNAME" in found["socket"].remedy


def test_nccl_init_failures_map_to_their_remedies():
    found = _by_rule(_scan("nccl_init.log"))
    assert found["duplicate_gpu"].ranks == [0, 1]
    assert "set_device" in found["duplicate_gpu"].remedy
    # the "unhandled system error" of rank 2 is explained by its /dev/shm WARN
    assert found["shm"].ranks == [2] and "df -h /dev/shm" in found["shm"].remedy
    assert "system_error" not in found


def _live(lines, known=()):
    scanner = LogScanner()
    scanner.ranks_seen.update(known)
    for rank, text in lines:
        scanner.feed(text, rank=rank)
    return scanner


WATCHDOG = ("[rank{r}]:[E1122 09:22:03.412000 4101 ProcessGroupNCCL.cpp:632] [PG ID 0 PG GUID "
            "0(default_pg) Rank {r}] Watchdog caught collective operation timeout: WorkNCCL("
            "SeqNum=5, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=1000) ran for 1001 "
            "milliseconds before timing out.")


def test_live_scanner_updates_one_finding_as_ranks_report():
    scanner = _live([(0, "step 1"), (1, "step 1"), (2, "step 1")], known={0, 1, 2})
    scanner.feed(WATCHDOG.format(r=0), rank=0)
    (first,) = scanner.changed()
    assert first.ranks == [1, 2]
    scanner.feed(WATCHDOG.format(r=1), rank=1)
    (second,) = scanner.changed()
    assert second.ranks == [2] and second.details["signature"] == first.details["signature"]
    scanner.feed("loss 2.31", rank=2)
    assert scanner.changed() == []  # ordinary output: nothing new


def test_timeout_reported_by_a_few_ranks_of_an_unknown_world_blames_nobody():
    scanner = _live([(r, WATCHDOG.format(r=r)) for r in (0, 2, 4)])
    (f,) = scanner.findings()
    assert f.ranks == [] and "not in this log" in f.summary


def test_scanner_is_bounded_and_ignores_ordinary_output():
    scanner = LogScanner()
    for i in range(MAX_SIGNALS + 500):
        scanner.feed(f"[rank{i % 9000}]: host:1:1 [0] NCCL WARN novel problem {i}")
    assert len(scanner.signals) <= MAX_SIGNALS and scanner.dropped > 0
    assert len(scanner.findings()) < 200
    quiet = _live([(None, "step 1 loss 2.3"), (None, "x" * 100_000),
                   (None, "\x00\xff garbage")])
    assert quiet.findings() == []


def test_diagnose_log_bad_input_is_one_line(tmp_path):
    missing = run_cli(["diagnose", "--log", str(tmp_path / "nope.log")], timeout=60)
    assert missing.returncode == 2 and "not found" in missing.stderr
    assert "Traceback" not in missing.stderr and len(missing.stderr.strip().splitlines()) == 1
    with pytest.raises(UserError):
        scan_logs([str(tmp_path)])  # a directory
    binary = tmp_path / "core"
    binary.write_bytes(bytes(range(256)) * 4096)
    res = run_cli(["diagnose", "--log", str(binary), "--json"], timeout=60)
    assert res.returncode == 0 and json.loads(res.stdout)["findings"] == []
    healthy = run_cli(["diagnose", "--log", str(LOGS / "source" / "healthy_benign_nccl_warn.log")],
                      timeout=60)
    assert healthy.returncode == 0 and "no known failure in" in healthy.stdout


def test_diagnose_log_json_and_exit_code():
    res = run_cli(["diagnose", "--log", str(LOGS / "gloo_rank_skipped.log"), "--json"],
                  timeout=60)
    assert res.returncode == 1, res.stderr  # an error-severity finding
    out = json.loads(res.stdout)
    assert [f["kind"] for f in out["findings"]] == ["hang"]
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
    assert "Gloo timed out" in res.stderr  # printed live
