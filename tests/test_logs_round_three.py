"""Issue 35's behaviour beyond what the corpus (tests/logcorpus.py, set `wide`) judges: no log
with an error line ends in silence, the first error in time wins, a file's name is a hint
only, restarts are said, and healthy logs that say "error" stay quiet."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from logtests import warned_of, write_named

from distdoctor.logs import scan_logs
from distdoctor.logs.families import ROUTES
from distdoctor.logs.scanner import LogScanner
from tests.conftest import run_cli

LOGS = Path(__file__).parent / "fixtures" / "logs"

# error lines no family knows, each with the words its finding must say
UNKNOWN = [
    ("ckpt.writer.CheckpointWriteException: shard 3 of 8 failed verification",
     "CheckpointWriteException"),
    ("terminate called after throwing an instance of 'std::out_of_range'\n"
     "  what():  map::at", "map::at"),
    ("Fatal Python error: Aborted", "Fatal Python error"),
    ("[host-3:1201 :0:1290] Caught signal 11 (Segmentation fault: invalid permissions)",
     "Segmentation fault"),
    ("*** SIGBUS received at time=1785913868 on cpu 12 ***", "SIGBUS"),
    ("MeshFailure: device mesh (2, 4) does not divide 6 ranks", "MeshFailure"),
]


@pytest.mark.parametrize("shape", ["[rank{r}]: {line}", "[default{r}]:{line}", "{r}: {line}"])
@pytest.mark.parametrize("line, words", UNKNOWN)
def test_an_error_no_family_knows_is_said_as_unknown_with_its_rank(tmp_path, line, words, shape):
    body = "".join(shape.format(r=r, line=f"step {i} loss 2.0") + "\n"
                   for i in range(3) for r in range(4))
    body += "".join(shape.format(r=2, line=part) + "\n" for part in line.split("\n"))
    found, _ = scan_logs([write_named(tmp_path, "job.log", body)])
    (top,) = warned_of(found)
    assert top.severity == "error" and top.ranks == [2]
    assert words in top.summary and "not a known distributed-training failure" in top.summary
    assert top.details["family"] == "unknown"


def test_the_same_error_with_the_fast_reader_and_every_line_read(tmp_path):
    body = "".join(f"[rank{r}]: step {i}\n" for i in range(50) for r in range(2))
    body += "[rank1]: omegaconf.errors.ConfigKeyError: Missing key optimizer\n"
    path = write_named(tmp_path, "job.log", body)
    fast = scan_logs([path])[0]
    every = scan_logs([path], anchors=ROUTES)[0]
    assert [f.to_json() for f in fast] == [f.to_json() for f in every]
    assert fast[0].ranks == [1] and "ConfigKeyError" in fast[0].summary


def test_the_first_error_in_time_wins_over_the_order_of_the_files(tmp_path):
    # rank 1's file is read first, but rank 0's error is 3 s older by the logs' own stamps
    write_named(tmp_path, "a.log", "2026-11-27 10:00:05,000 [rank1]: DataShardError: shard 9 "
                              "is empty\n")
    write_named(tmp_path, "b.log", "2026-11-27 10:00:02,000 [rank0]: TokenizerLoadError: vocab "
                              "file is missing\n")
    found, _ = scan_logs([str(tmp_path / "*.log")])
    (top,) = warned_of(found)
    assert top.ranks == [0] and "TokenizerLoadError" in top.summary
    # the later one is a consequence of it, not a second root cause
    assert "DataShardError" in top.details["consequences"][0]["summary"]


def test_without_stamps_the_first_error_in_the_log_wins(tmp_path):
    text = ("[rank3]: ShardMissingError: shard 4 not found\n"
            "[rank0]: WriterClosedError: the writer was closed\n")
    (top,) = warned_of(scan_logs([write_named(tmp_path, "job.log", text)])[0])
    assert top.ranks == [3] and "ShardMissingError" in top.summary


# torchrun's report alone (the ranks' output went elsewhere): local rank 0 was SIGKILLed
REPORT = """W1127 07:00:01.100000 900 torch/distributed/elastic/multiprocessing/api.py:900] Sending process 911 closing signal SIGTERM
W1127 07:00:01.100000 900 torch/distributed/elastic/multiprocessing/api.py:900] Sending process 912 closing signal SIGTERM
E1127 07:00:01.300000 900 torch/distributed/elastic/multiprocessing/api.py:875] failed (exitcode: -9) local_rank: 0 (pid: 910) of binary: /opt/venv/bin/python
Traceback (most recent call last):
  File "/opt/venv/lib/python3.11/site-packages/torch/distributed/launcher/api.py", line 269, in launch_agent
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-27_07:00:01
  host      : gpu-07
  rank      : 1 (local_rank: 1)
  exitcode  : -15 (pid: 911)
  error_file: <N/A>
  traceback : Signal 15 (SIGTERM) received by PID 911
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-27_07:00:01
  host      : gpu-07
  rank      : 0 (local_rank: 0)
  exitcode  : -9 (pid: 910)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 910
============================================================
"""


def test_a_file_name_is_a_hint_and_the_text_wins(tmp_path):
    """The same report under the names per-node logs get: `node_rank0.log` (a node's),
    `train_rank0.log` (the name says rank 0; the launcher's lines are the launcher's), and a
    neutral name: one answer."""
    answers = []
    for name in ("node_rank0.log", "train_rank0.log", "job.log"):
        found, _ = scan_logs([write_named(tmp_path, name, REPORT)])
        answers.append([(f.kind, f.severity, f.ranks, f.summary) for f in found])
    assert answers[0] == answers[1] == answers[2]
    assert answers[0][0][2] == [0] and "SIGKILL" in answers[0][0][3]


def test_a_report_in_a_shape_not_read_never_stops_the_reading(tmp_path):
    text = REPORT.replace("rank      : 0 (local_rank: 0)", "rank      : zero").replace(
        "exitcode  : -9 (pid: 910)", "exitcode  : killed")
    found, _ = scan_logs([write_named(tmp_path, "job.log", text)])
    assert warned_of(found)  # the one-line report still says local rank 0 was SIGKILLed


def test_node_rank_in_a_name_is_a_node_not_a_rank(tmp_path):
    from distdoctor.logs.files import numbers_in_names

    names = numbers_in_names(["/x/node_rank3.log", "/x/run_rank5.log", "/x/local_rank1.log"])
    assert names == {"/x/node_rank3.log": ("node", 3), "/x/run_rank5.log": ("rank", 5)}


def test_a_restart_the_group_recovered_from_is_a_warning_not_an_alarm():
    found, _ = scan_logs([str(LOGS / "real" / "elastic_restart_recovers.log")])
    (top,) = warned_of(found)
    assert top.severity == "warning" and top.ranks == [1]
    assert "restarted the worker group 1 time" in top.summary and top.details["restarts"] == 1
    proc = run_cli(["diagnose", "--log", str(LOGS / "real" / "elastic_restart_recovers.log")])
    assert proc.returncode == 0, proc.stdout + proc.stderr  # a warning: exit 0


def test_a_restart_that_failed_again_says_so():
    found, _ = scan_logs([str(LOGS / "real" / "elastic_restart_fails_again.log")])
    top = warned_of(found)[0]
    assert top.severity == "error" and top.ranks == [1] and "failed again" in top.summary


def test_a_membership_change_alone_is_no_failure(tmp_path):
    text = ("I1127 08:00:00.000000 700 torch/distributed/elastic/agent/server/api.py:840] "
            "[default] Detected 1 new nodes from group_rank=0; will restart worker group\n"
            "[rank0]: step 10 loss 1.0\n")
    found, _ = scan_logs([write_named(tmp_path, "job.log", text)])
    assert not warned_of(found)
    assert [f.severity for f in found] == ["info"] and "membership change" in found[0].summary


def test_an_error_its_process_lived_long_past_is_info_not_an_alarm(tmp_path):
    text = "[rank0]: HubDownloadError: retrying shard 2 after a reset connection\n"
    text += "".join(f"[rank0]: step {i} loss {2 - i / 100:.2f}\n" for i in range(80))
    found, _ = scan_logs([write_named(tmp_path, "job.log", text)])
    assert not warned_of(found)
    assert found[0].severity == "info" and "went on" in found[0].summary


def test_the_live_scanner_reads_a_traceback_whose_last_line_holds_no_anchor():
    sc = LogScanner()
    for line in ["[rank1]: Traceback (most recent call last):",
                 '[rank1]:   File "/w/train.py", line 7, in <module>',
                 "[rank1]:     compiled(x)",
                 "[rank1]: torch._dynamo.exc.Unsupported: call_function BuiltinVariable(open)"]:
        sc.feed(line)
    (top,) = warned_of(sc.findings())
    assert top.ranks == [1] and "Unsupported" in top.summary
    assert top.callsites[0]["file"] == "/w/train.py" and top.callsites[0]["line"] == 7


def test_a_traceback_cut_before_its_exception_line_is_still_said(tmp_path):
    text = ("[rank5]: Traceback (most recent call last):\n"
            '[rank5]:   File "/w/train.py", line 40, in save\n'
            "[rank5]:     writer.flush(shard)\n")
    (top,) = warned_of(scan_logs([write_named(tmp_path, "job.log", text)])[0])
    assert top.ranks == [5] and "cuts off" in top.summary and "train.py:40" in top.summary


@pytest.mark.parametrize("line", [
    "[rank0]: UserWarning: Error checking compiler version for cl",
    "[rank0]: FutureWarning: `evaluation_strategy` is deprecated",
    "[rank0]: error_if_nonfinite ........... False",
    "[rank0]: {'loss': 1.2, 'error_rate': 0.01}",
    "host:1:1 [0] NCCL INFO NET/IB : No device found.",
    "[rank0]: Retrying after a ConnectionError was logged by the downloader",
    "[rank0]:  [WARNING]  async_io requires the dev libaio .so object and headers but these "
    "were not found.",
])
def test_lines_that_say_error_in_a_healthy_run_stay_quiet(tmp_path, line):
    text = "".join(f"[rank{r}]: step {i}\n" for i in range(5) for r in range(2)) + line + "\n"
    found, _ = scan_logs([write_named(tmp_path, "job.log", text)])
    assert not warned_of(found), [f.summary for f in found]


def test_a_recorded_slurm_log_under_another_name_gives_the_same_answer(tmp_path):
    src = LOGS / "wide" / "slurm_srun_killed.log"
    a = scan_logs([str(src)])[0]
    copy = tmp_path / "node_rank1.log"
    shutil.copy(src, copy)
    b = scan_logs([str(copy)])[0]
    assert [(f.kind, f.ranks, f.summary) for f in a] == [(f.kind, f.ranks, f.summary) for f in b]


def test_nccl_ras_names_the_processes_it_found_dead(tmp_path):
    # NCCL 2.30 src/ras/client_support.cc's DEAD entry (text format); pid and host invented
    text = ("Errors\n======\n\nDEAD\n"
            "  1 job process is considered dead (unreachable via the RAS network)\n"
            "  Process 4412 on node gpu-n07 managing GPU 3\n\n")
    (top,) = warned_of(scan_logs([write_named(tmp_path, "ras.txt", text)])[0])
    assert "process 4412 on gpu-n07 (GPU 3)" in top.summary and top.details["family"] == "ras"


def test_live_a_traceback_still_being_printed_is_no_finding_yet():
    sc = LogScanner()
    sc.feed("[rank2]: Traceback (most recent call last):")
    sc.feed('[rank2]:   File "/w/train.py", line 9, in <module>')
    assert not warned_of(sc.findings())  # its last line has not come yet
    sc.feed("[rank2]: KeyError: 'labels'")
    (top,) = warned_of(sc.findings())
    assert top.ranks == [2] and "KeyError" in top.summary


def test_an_exception_python_ignored_at_shutdown_is_no_failure(tmp_path):
    text = ("[rank0]: training done\n"
            "[rank0]: Exception ignored in: <function Pool.__del__ at 0x7f00>\n"
            "[rank0]: Traceback (most recent call last):\n"
            '[rank0]:   File "/usr/lib/python3.11/multiprocessing/pool.py", line 271, in __del__\n'
            "[rank0]: TypeError: 'NoneType' object is not callable\n")
    assert not warned_of(scan_logs([write_named(tmp_path, "job.log", text)])[0])
    # the same traceback without Python's "ignored" line is an error
    text = text.replace("[rank0]: Exception ignored in: <function Pool.__del__ at 0x7f00>\n", "")
    assert warned_of(scan_logs([write_named(tmp_path, "job2.log", text)])[0])
