"""Issue 42's behaviour: heads no rule knows learned from the log, stalls told only by INFO
and WARNING lines, launchers' traps. Fixtures: tests/fixtures/logs/round4/ (each with a
sidecar naming its source project, version and what a right diagnosis says)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from logtests import says_what_its_sidecar_expects, warned_of, write_named

from distdoctor.logs import scan_logs
from distdoctor.logs.heads import learn
from distdoctor.logs.lines import parse_line

ROUND4 = Path(__file__).parent / "fixtures" / "logs" / "round4"
JOBS = Path(__file__).parent / "jobs"


@pytest.mark.parametrize("log", sorted(ROUND4.glob("*.log")), ids=lambda p: p.stem)
def test_each_fixture_says_what_its_sidecar_expects(log):
    says_what_its_sidecar_expects(log)


# --- any head -------------------------------------------------------------------------------
# heads of shapes lines.py has no rule for: (head, the rank it names or None)
HEADS = [
    ("(VllmWorker rank={r} pid=10{r}) ERROR 09-09 02:24:28 [multiproc_executor.py:522] ", True),
    ("(EngineCore_DP{r} pid=33{r}) WARNING 11-02 10:01:12 [core.py:701] ", False),
    ("<worker rank={r}> 2025-06-01 10:00:01.123 | ERROR | train.py:88 | ", True),
    ("[trainer] [global_rank {r}] 10:00:01 ERROR - ", True),
    # SGLang's "[time TPn]" (a tensor-parallel rank, not a global one)
    ("[2025-09-09 02:24:28 TP{r}] ", False),
    # torchtitan under torchrun: "[rankN]:[titan] time - logger - LEVEL - "
    ("[rank{r}]:[titan] 2025-01-01 10:00:01,123 - root - INFO - ", True),
    # Ascend HCCL's head, the rank last
    ("[ERROR] HCCL(4{r}1,python):2025-01-01-10:00:00.123.456 [hccl_comm.cc:88][4{r}1][Rank {r}]",
     True),
    # loguru's default format
    ("2025-01-01 10:00:00.123 | INFO     | worker{r} | train:run:41 - ", False),
    # LLaMA-Factory's transformers logger head
    ("[INFO|trainer.py:2245] 2025-01-01 10:00:00,123 >> ", False),
    # Megatron-style " [time] rank N: "
    (" [2025-01-01 10:00:01] rank {r}: ", True),
]


@pytest.mark.parametrize("head, has_rank", HEADS)
def test_an_exception_after_any_head_is_found_with_the_rank_the_head_names(tmp_path, head,
                                                                           has_rank):
    body = "".join(head.format(r=r) + f"step {i} done in 0.31s\n" for i in range(4)
                   for r in range(3))
    body += head.format(r=2) + "ckpt.io.ShardWriteError: shard 5 of 8 lost its lease\n"
    found, read = scan_logs([write_named(tmp_path, "job.log", body)])
    (top,) = warned_of(found)
    assert "ShardWriteError" in top.summary
    assert top.ranks == ([2] if has_rank else [])


@pytest.mark.parametrize("head, has_rank", HEADS[:3])
def test_a_bare_exception_after_any_head_is_the_failure_not_a_cut_traceback(tmp_path, head,
                                                                             has_rank):
    """`raise Exception("...")` (vLLM's WorkerProc.wait_for_ready, user code) ends its
    traceback with the bare class name; alone on a line it is said too."""
    body = "".join(head.format(r=r) + f"step {i} done in 0.31s\n" for i in range(4)
                   for r in range(3))
    tb = ["Traceback (most recent call last):", '  File "worker.py", line 41, in wait_ready',
          "    raise e from None", "Exception: WorkerProc initialization failed"]
    body += "".join(head.format(r=1) + ln + "\n" for ln in tb)
    (top,) = warned_of(scan_logs([write_named(tmp_path, "job.log", body)])[0])
    assert "Exception: WorkerProc initialization failed" in top.summary
    assert "cuts off" not in top.summary and top.ranks == ([1] if has_rank else [])
    alone = write_named(tmp_path, "alone.log", "loading\nException: config key 'lr' missing\n")
    (top,) = warned_of(scan_logs([alone])[0])
    assert "config key 'lr' missing" in top.summary
    quiet = write_named(tmp_path, "quiet.log", "Exception ignored in: <function Pool.__del__>\n")
    assert warned_of(scan_logs([quiet])[0]) == []


@pytest.mark.parametrize("head, _", HEADS)
def test_a_healthy_log_under_any_head_stays_quiet(tmp_path, head, _):
    body = "".join(head.format(r=r) + f"step {i} loss {2.0 - i / 10:.2f} error_rate 0.01\n"
                   for i in range(20) for r in range(4))
    found, _ = scan_logs([write_named(tmp_path, "job.log", body)])
    assert warned_of(found) == []


def test_the_learned_head_is_peeled_and_a_payload_repeated_on_every_line_is_not():
    lines = [f"(VllmWorker rank={r} pid=4{r}) INFO 01-01 00:00:0{r} [gpu_worker.py:9] hello"
             for r in range(4)]
    head = learn([parse_line(t).text for t in lines])
    line = parse_line(lines[3], head=head)
    assert (line.text, line.rank, line.pid, line.level) == ("hello", 3, 43, "INFO")
    same = ["Waiting in store based barrier for rank: 0"] * 10
    assert learn(same) is None


def test_interleaved_workers_are_told_apart(tmp_path):
    found, read = scan_logs([str(ROUND4 / "vllm_v1_interleaved.log")])
    assert "from 3 ranks" in read


# --- stalls told by INFO lines ----------------------------------------------------------------
BARRIER = ("[2025-03-11 08:14:{s:02d},101] INFO torch.distributed.distributed_c10d: Waiting in "
           "store based barrier to initialize process group for rank: 0, key: "
           "store_based_barrier_key:1 (world_size=4, worker_count={n}, timeout=0:30:00)\n")


def test_a_barrier_that_completes_is_no_stall(tmp_path):
    body = "".join(BARRIER.format(s=10 * i, n=1) for i in range(3))
    body += ("[2025-03-11 08:14:40,101] INFO torch.distributed.distributed_c10d: Rank 0: "
             "Completed store-based barrier for key:store_based_barrier_key:1 with 4 nodes.\n")
    assert warned_of(scan_logs([write_named(tmp_path, "a.log", body)])[0]) == []
    full = "".join(BARRIER.format(s=10 * i, n=1 + i) for i in range(4))  # 4 of 4 arrive
    assert warned_of(scan_logs([write_named(tmp_path, "b.log", full)])[0]) == []


def test_a_barrier_short_of_its_world_is_a_stall_with_counts_and_time(tmp_path):
    body = "".join(BARRIER.format(s=10 * i, n=min(1 + i, 3)) for i in range(5))
    (top,) = warned_of(scan_logs([write_named(tmp_path, "c.log", body)])[0])
    assert "3 of 4 ranks checked in" in top.summary and "40 s" in top.summary
    assert "0:30:00" in top.summary and top.ranks == []


def test_real_torch_barrier_wait_cut_before_its_timeout_is_a_stall(tmp_path):
    real = (ROUND4 / "torch_store_barrier_real.log").read_text().splitlines(keepends=True)
    waits = [ln for ln in real if "Waiting in store based barrier" in ln]
    cut = real[:real.index(waits[-1]) + 1]
    (top,) = warned_of(scan_logs([write_named(tmp_path, "cut.log", "".join(cut))])[0])
    assert "stall" in top.summary and "1 of 2" in top.summary and "rank 0" in top.summary


@pytest.mark.extended
def test_real_torch_barrier_wait_produced_here(tmp_path):
    out = subprocess.run([sys.executable, str(JOBS / "store_barrier_alone.py"), "11"],
                         capture_output=True, text=True, timeout=120)
    lines = (out.stdout + out.stderr).splitlines(keepends=True)
    waits = [i for i, ln in enumerate(lines) if "Waiting in store based barrier" in ln]
    assert waits, lines[:5]
    cut = write_named(tmp_path, "cut.log", "".join(lines[:waits[-1] + 1]))
    (top,) = warned_of(scan_logs([cut])[0])
    assert "1 of 2 ranks checked in" in top.summary
    (full,) = warned_of(scan_logs([write_named(tmp_path, "full.log", "".join(lines))])[0])
    assert "timed out" in full.summary and "1 of 2" in full.summary


def test_wait_for_input_timeouts_are_the_stall_not_the_cut_traceback():
    found, _ = scan_logs([str(ROUND4 / "c10d_wait_for_input_cut.log")])
    (top,) = warned_of(found)
    assert "ranks 3, 4" in top.summary and "node-0:5000" in top.summary
    assert "cuts off" not in top.summary


def test_a_repeated_shared_memory_broadcast_wait_is_a_stall(tmp_path):
    line = ("(VllmWorker rank=0 pid=7) INFO 09-09 02:{m:02d}:00 [shm_broadcast.py:466] No "
            "available shared memory broadcast block found in 60 seconds. This typically "
            "happens when some processes are hanging.\n")
    (top,) = warned_of(scan_logs([write_named(tmp_path, "s.log", "".join(
        line.format(m=m) for m in range(3)))])[0])
    assert "3 times" in top.summary and "2 min" not in top.summary
    quiet = write_named(tmp_path, "q.log", line.format(m=0))
    assert warned_of(scan_logs([quiet])[0]) == []


# --- launchers ----------------------------------------------------------------------------
DS = ("[2025-01-07 11:02:13,554] [INFO] [launch.py:319:sigkill_handler] Killing subprocess 911\n"
      "[2025-01-07 11:02:13,555] [INFO] [launch.py:319:sigkill_handler] Killing subprocess 912\n"
      "[2025-01-07 11:02:13,604] [ERROR] [launch.py:325:sigkill_handler] ['/usr/bin/python', "
      "'-u', 'train.py', '--local_rank={lr}', '--deepspeed'] exits with return code = 1\n")


def test_deepspeeds_sigkill_command_is_the_last_spawned_rank_not_the_failing_one(tmp_path):
    (top,) = warned_of(scan_logs([write_named(tmp_path, "ds.log", DS.format(lr=1))])[0])
    assert top.ranks == [] and "does not say which" in top.summary
    one = DS.format(lr=0).replace(DS.splitlines(keepends=True)[1], "")
    (top,) = warned_of(scan_logs([write_named(tmp_path, "ds1.log", one)])[0])
    assert top.ranks == [0]


def test_bad_input_is_one_line_not_a_traceback(tmp_path):
    from tests.conftest import run_cli

    r = run_cli(["diagnose", "--log", str(tmp_path / "missing.log")])
    assert r.returncode != 0 and "Traceback" not in r.stderr


# --- a cut window proves no absence ---------------------------------------------------------
TIMEOUTS = "".join(
    f"[rank{r}]:[E1102 10:30:00.1 ProcessGroupNCCL.cpp:632] [Rank {r}] Watchdog caught "
    f"collective operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE, NumelIn=1, "
    f"NumelOut=1, Timeout(ms)=600000) ran for 600083 milliseconds before timing out.\n"
    for r in range(3))
START = "".join(f"[rank{r}]:world_size=4 rank={r} starting\n" for r in range(4))


def test_a_window_that_starts_mid_run_names_no_rank_from_absence(tmp_path):
    whole = write_named(tmp_path, "whole.log", START + "[rank3]:step 1\n" + TIMEOUTS)
    (top,) = warned_of(scan_logs([whole])[0])
    assert top.ranks == [3]  # the log shows rank 3 and its start: its silence is evidence
    cut = write_named(tmp_path, "cut.log", '  File "/w/train.py", line 9, in step\n'
                 + START + TIMEOUTS)
    found, read = scan_logs([cut])
    (top,) = warned_of(found)
    assert top.ranks == [] and "starts mid-run" in read and "File" in read
    assert "starts mid-run" not in scan_logs([whole])[1]


# --- what follows an NCCL error, and writes glued together -----------------------------------
NCCL_ERR = ("torch.distributed.DistBackendError: NCCL error in: /pt/ProcessGroupNCCL.cpp:93, "
            "unhandled cuda error (run with NCCL_DEBUG=INFO for details), NCCL version 2.29.3\n"
            "ncclUnhandledCudaError: Call to CUDA function failed.\nLast error:\n{last}\n")


def test_an_nccl_errors_late_last_error_line_names_its_cause(tmp_path):
    nvls = ("Failed to bind NVLink SHARP (NVLS) Multicast memory of size 4194304 : CUDA error "
            "401 'the operation cannot be performed in the present state'")
    (top,) = warned_of(scan_logs([write_named(tmp_path, "a.log", NCCL_ERR.format(last=nvls))])[0])
    assert "NVLS" in top.summary and "401" in top.summary
    sock = NCCL_ERR.format(last="Bootstrap : no socket interface found")
    (top,) = warned_of(scan_logs([write_named(tmp_path, "b.log", sock)])[0])
    assert "socket" in top.summary


def test_an_nvls_warning_nccl_fell_back_from_stays_quiet(tmp_path):
    body = ("host1:77:77 [0] NCCL INFO NVLS multicast support is available on dev 0\n"
            "host1:77:77 [0] NCCL WARN Failed to bind NVLink SHARP (NVLS) Multicast memory of "
            "size 4194304 : CUDA error 401\n"
            "host1:77:77 [0] NCCL INFO Channel 00/24 : 0 1 2 3\n"
            "host1:77:77 [0] NCCL INFO ncclCommInitRank comm 0x1 rank 0 nranks 4 - Init "
            "COMPLETE\n")
    assert warned_of(scan_logs([write_named(tmp_path, "w.log", body)])[0]) == []


def test_a_log_head_glued_to_a_progress_bar_is_its_own_line(tmp_path):
    bars = {1: "Map:  41%|████      | 4100/10000 [29:58<41:02, 2.3 examples/s]",
            3: "Map:  42%|████▏     | 4200/10000 [30:41<41:00, 2.3 examples/s]"}
    body = "".join(
        f"{bars.get(r, '')}[E ProcessGroupNCCL.cpp:475] [Rank {r}] Watchdog caught "
        f"collective operation timeout: WorkNCCL(SeqNum=2, OpType=ALLREDUCE, NumelIn=1, "
        f"NumelOut=1, Timeout(ms)=1800000) ran for 1800527 milliseconds before timing out.\n"
        for r in (1, 2, 3))
    (top,) = warned_of(scan_logs([write_named(tmp_path, "g.log", body)])[0])
    assert top.ranks == [0] and "busy" in top.summary


def test_an_agents_sigterm_after_srun_ended_the_step_is_no_cause(tmp_path):
    agent = "WARNING:torch.distributed.elastic.agent.server.api:"
    body = ("srun: error: node-b12: task 1: Exited with exit code 1\n"
            "srun: Terminating StepId=5512.0\n"
            f"{agent}Received 15 death signal, shutting down workers\n"
            "WARNING:torch.distributed.elastic.multiprocessing.api:Sending process 4110 closing "
            "signal SIGTERM\n")
    found, _ = scan_logs([write_named(tmp_path, "s.log", body)])
    assert not any("launcher itself" in f.summary for f in warned_of(found))
    alone = write_named(tmp_path, "t.log", f"{agent}Received 15 death signal, shutting down workers\n")
    (top,) = warned_of(scan_logs([alone])[0])
    assert "launcher itself" in top.summary  # with no step torn down, the signal is the cause


def test_a_store_address_no_host_has_is_named(tmp_path):
    body = "".join(
        f"[W socket.cpp:697] [c10d] The client socket has failed to connect to {a}:29400 "
        f"(errno: 110 - Connection timed out).\n" for a in ("[::ffff:0.61.88.17]", "0.61.88.17"))
    body += ("[E socket.cpp:753] [c10d] The client socket has failed to connect to any network "
             "address of (4020241, 29400).\n")
    (top,) = warned_of(scan_logs([write_named(tmp_path, "n.log", body)])[0])
    assert "4020241 is all digits" in top.summary and "0.61.88.17" in top.summary
    good = body.replace("0.61.88.17", "10.2.0.7").replace("4020241", "head-node")
    (top,) = warned_of(scan_logs([write_named(tmp_path, "g.log", good)])[0])
    assert "all digits" not in top.summary and "no host has" not in top.summary


def test_a_network_plugins_failed_request_blames_the_fabric_not_the_rank_that_saw_it(tmp_path):
    body = ("[rank5]: torch.distributed.DistBackendError: NCCL error in: /pt/ProcessGroupNCCL."
            "cpp:3763, remote process exited or there was a network error, NCCL version 2.28.8\n"
            "[rank5]: ncclRemoteError: A call failed possibly due to a network error or a remote "
            "process exiting prematurely.\n[rank5]: Last error:\n"
            "[rank5]: NET/OFI Request 0x7f00aa10 completed with error. RC: 113. Error: 2 "
            "(UNDELIVERABLE). Completed length: 0\n"
            "[rank6]: Traceback (most recent call last):\n"
            '[rank6]:   File "/w/train.py", line 40, in <module>\n')
    (top,) = warned_of(scan_logs([write_named(tmp_path, "o.log", body)])[0])
    assert "OFI" in top.summary and "UNDELIVERABLE" in top.summary and top.ranks == []


@pytest.mark.timeout(90)
def test_an_excerpt_ending_in_torchruns_sigterms_says_a_worker_failed(tmp_path):
    """Real torchrun output, cut after the agent's SIGTERMs (before its failure table, as
    pasted excerpts often are): a worker failed, and it is not one of those stopped."""
    from distdoctor.launch.env import free_port

    out = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "3", "--master-port",
         str(free_port()), "-r", "3", "--log-dir", str(tmp_path / "workers"),
         str(JOBS / "logfail" / "one_worker_exits.py")],
        capture_output=True, text=True, timeout=80, stdin=subprocess.DEVNULL)
    lines = (out.stdout + out.stderr).splitlines(keepends=True)
    stops = [i for i, ln in enumerate(lines) if "closing signal SIGTERM" in ln]
    failed = next(ln for ln in lines if "failed (exitcode: 3)" in ln)
    assert len(stops) == 2, lines
    cut = write_named(tmp_path, "cut.log", "".join(lines[:stops[-1] + 1]))
    (top,) = warned_of(scan_logs([cut])[0])
    assert "stopped 2 workers" in top.summary and top.ranks == [], top.summary
    assert failed.split("(pid: ")[1].split(")")[0] not in top.summary
    full = warned_of(scan_logs([write_named(tmp_path, "full.log", "".join(lines))])[0])
    assert full[0].ranks == [1] and not any("stopped 2 workers" in f.summary for f in full)


def test_a_monitored_barrier_peer_says_the_rank_torch_points_at_without_blaming_it(tmp_path):
    """ProcessGroupGloo.cpp's words (torch 2.x): the rank it names may itself be a victim,
    so it is said as where to look, not as the culprit."""
    text = "".join(
        f"[rank{r}]:[E421 04:13:43.4266 ProcessGroupGloo.cpp:143] Rank {r} successfully reached "
        f"monitoredBarrier, but received errors while waiting for send/recv from rank 0. "
        f"Please check rank 0 logs for faulty rank.\n" for r in (2, 3))
    (top,) = warned_of(scan_logs([write_named(tmp_path, "job.log", text)])[0])
    assert "from rank 0 (torch: check rank 0's logs)" in top.summary and top.ranks == []
