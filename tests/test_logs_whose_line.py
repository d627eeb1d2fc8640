"""Whose line it is: a process's rank read from what the log says of that process (a Ray
pid counts on its own node only, NCCL's transport lines name their process's rank), a
launcher's own traceback told from a rank's, a cause with no rank followed by what the
others saw, and a watchdog line cut inside its words (found on public logs in the third
submission of issue 42)."""

from __future__ import annotations

import pytest
from logtests import warned_of, write_named

from distdoctor.logs import scan_logs

RAY_DEATH = ("(raylet) A worker died or was killed while executing a task by an unexpected "
             "system error. Worker IP address: {ip} Worker port: 10005 Worker PID: 833 Worker "
             "exit type: SYSTEM_ERROR Worker exit detail: Worker unexpectedly exits with a "
             "connection error code 2. End of file.\n")


@pytest.mark.parametrize("ip, rank", [("10.0.0.2", None), ("10.0.0.1", 62)])
def test_a_pid_names_a_ray_worker_only_on_its_own_node(tmp_path, ip, rank):
    """Pids repeat across nodes: rank 62 printed as pid 833 on 10.0.0.1 is the worker Ray
    reports dead only where the death is on that node too."""
    text = ("(WorkerDict pid=833, ip=10.0.0.1) [rank=62, world_size=64] initialized\n"
            + RAY_DEATH.format(ip=ip))
    (top,) = warned_of(scan_logs([write_named(tmp_path, "job.log", text)])[0])
    assert top.ranks == ([rank] if rank is not None else []), top.summary
    assert ("its rank is not in this log" in top.summary) == (rank is None)


def test_a_watchdog_timeout_whose_line_is_cut_is_still_a_watchdog_timeout(tmp_path):
    """A pasted window's last line, cut inside the watchdog's words: the rest (the SeqNum,
    the op) is lost, what it was is not."""
    cut = ("[rank3]:[E809 14:59:33.656957424 ProcessGroupNCCL.cpp:629] [Rank 3] Watchdog "
           "caught collective oper")
    (top,) = warned_of(scan_logs([write_named(tmp_path, "job.log", cut)])[0])
    assert "NCCL watchdog timeout (its line cut off before the SeqNum)" in top.summary
    assert top.details["rule"] == "watchdog_timeout"


def _channels(pairs) -> str:
    """NCCL INFO transport lines (src/transport/shm.cc's format) of processes on node-a:
    (pid, the CUDA device it prints, its rank, the peer)."""
    return "".join(f"node-a:{pid}:{pid + 7} [{dev}] NCCL INFO Channel 00/0 : {me}[{dev}000] -> "
                   f"{peer}[{peer}000] via SHM/direct/direct\n" for pid, dev, me, peer in pairs)


@pytest.mark.parametrize("pairs, rank", [
    # the process on device 2 is rank 2 of the job's communicator
    ([(501, 0, 0, 1), (502, 1, 1, 2), (503, 2, 2, 3), (504, 3, 3, 0)], 2),
    # ... or two communicators' numbering (it is rank 2 in one, rank 0 in another): no rank
    ([(503, 2, 2, 3), (503, 2, 0, 1)], None),
])
def test_the_rank_of_an_nccl_warning_is_read_from_its_process_transport_lines(tmp_path, pairs,
                                                                              rank):
    """`host:pid:tid [dev]` heads carry the CUDA device, not the rank; the process's own
    transport lines name its rank where they agree."""
    text = _channels(pairs) + ("\nnode-a:503:503 [2] enqueue.cc:1085 NCCL WARN Cuda failure "
                               "'out of memory'\n")
    (top,) = warned_of(scan_logs([write_named(tmp_path, "job.log", text)])[0])
    assert "out of memory" in top.summary
    assert top.ranks == ([rank] if rank is not None else [])


def test_a_cause_that_names_no_rank_says_what_the_others_saw_of_it(tmp_path):
    """A Ray worker dead on some node, its rank not in the log: the NCCL error a process
    then reported is where to look next, said after it (never as a culprit)."""
    text = (RAY_DEATH.format(ip="10.0.0.2")
            + "(WorkerDict pid=912, ip=10.0.0.2) [rank1]:[E1224 13:23:05.48 ProcessGroupNCCL."
              "cpp:542] [Rank 1] Collective WorkNCCL(SeqNum=1, OpType=BROADCAST) raised the "
              "following async exception: NCCL error: remote process exited or there was a "
              "network error, NCCL version 2.21.5\n")
    (top,) = warned_of(scan_logs([write_named(tmp_path, "job.log", text)])[0])
    assert top.ranks == [] and "died (SYSTEM_ERROR)" in top.summary
    assert "; then NCCL remote error" in top.summary


def test_the_launchers_own_traceback_cut_off_is_its_report_not_the_ranks(tmp_path):
    """accelerate-launch runs torchrun in-process: after "failed (exitcode: 1) local_rank:
    3" comes the launcher's own traceback (here cut before its ChildFailedError). Rank 3's
    exit is the finding; the launcher's frames are not rank 3's."""
    head = "stderr: "
    text = "".join(head + line + "\n" for line in (
        "WARNING:torch.distributed.elastic.multiprocessing.api:Sending process 4101 closing "
        "signal SIGTERM",
        "ERROR:torch.distributed.elastic.multiprocessing.api:failed (exitcode: 1) local_rank: "
        "3 (pid: 4104) of binary: /opt/conda/bin/python",
        "Traceback (most recent call last):",
        '  File "/opt/conda/bin/accelerate-launch", line 8, in <module>',
        "    sys.exit(main())",
        '  File "/opt/conda/lib/python3.10/site-packages/torch/distributed/run.py", line 797, '
        "in run",
        "    elastic_launch(",
        "  File"))
    (top,) = warned_of(scan_logs([write_named(tmp_path, "job.log", text)])[0])
    assert top.ranks == [3] and "exited with code 1" in top.summary, top.summary
    assert not any("accelerate-launch" in (c.get("file") or "") for c in top.callsites)
