"""`distdoctor check`: real local ranks (gloo), each bad condition made for real where
this machine allows it (a taken port, a missing interface, one node's different NCCL
variable, a duplicated CUDA_VISIBLE_DEVICES, a 64 MB tmpfs as /dev/shm, a full
checkpoint directory, an address nobody answers at), and the GPU checks through the
replayed NVML path (no GPU here). A check stopped by SIGTERM: test_check_sigterm.py."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from checkruns import _env, check, rows_of
from conftest import run_cli, small_disk

from distdoctor.launch.env import free_port

FIXTURES = Path(__file__).parent / "fixtures" / "nvml"


@pytest.mark.timeout(150)
def test_a_healthy_node_is_all_ok():
    proc, report = check(["--nproc", "4"], env=_env())
    assert proc.returncode == 0, proc.stderr
    assert not rows_of(report, "warn") and not rows_of(report, "fail"), report["rows"]
    checks = {r["check"] for r in report["rows"]}
    assert {"rendezvous port", "torch version", "same settings", "/dev/shm",
            "open files limit", "host memory", "device", "GPU health", "clock offset",
            "all_reduce result", "pairwise bandwidth"} <= checks, checks
    assert report["world_size"] == 4
    gpu = [r for r in report["rows"] if r["check"] == "GPU health"]
    assert gpu[0]["status"] == "n/a" and "no NVIDIA driver" in gpu[0]["found"]


@pytest.mark.timeout(150)
def test_a_taken_port_fails_and_names_who_holds_it():
    with socket.create_server(("127.0.0.1", 0)) as held:
        port = held.getsockname()[1]
        proc, report = check(["--nproc", "2", "--no-sweep"],
                             env=_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)))
    assert proc.returncode == 1
    bad = rows_of(report, "fail")
    assert [r["check"] for r in bad] == ["rendezvous port"], report["rows"]
    assert f"port {port} is taken" in bad[0]["found"]
    assert f"pid {os.getpid()}" in bad[0]["found"]  # this test holds it


@pytest.mark.timeout(150)
def test_bad_settings_fail_with_the_interfaces_the_node_has():
    proc, report = check(["--nproc", "2", "--no-sweep"], env=_env(
        NCCL_SOCKET_IFNAME="nosuch0", NCCL_DEBUG="LOUD", TORCH_NCCL_BLOCKING_WAIT="yes",
        NCCL_ASYNC_ERROR_HANDLING="1", NCCL_SOCKET_IFNAMES="eth0", NCCL_IBEXT_DISABLE="1"))
    assert proc.returncode == 1
    found = {r["found"].split("=")[0]: r for r in rows_of(report) if r["check"] ==
             "setting valid"}
    assert "matches no interface" in found["NCCL_SOCKET_IFNAME"]["found"]
    assert "lo" in found["NCCL_SOCKET_IFNAME"]["found"]  # what the node does have
    assert found["NCCL_DEBUG"]["status"] == "fail"
    assert found["TORCH_NCCL_BLOCKING_WAIT"]["status"] == "fail"
    assert found["NCCL_ASYNC_ERROR_HANDLING is the old name of "
                 "TORCH_NCCL_ASYNC_ERROR_HANDLING"]["status"] == "warn"
    typo = found["NCCL_SOCKET_IFNAMES is not a variable NCCL or torch reads: as set it "
                 "changes nothing (did you mean NCCL_SOCKET_IFNAME?)"]
    assert typo["status"] == "warn"
    assert not any("NCCL_IBEXT_DISABLE" in k for k in found)  # a plugin's: not judged


@pytest.mark.timeout(150)
def test_two_ranks_on_one_gpu_fail():
    proc, report = check(["--nproc", "2", "--no-sweep"], env=_env(CUDA_VISIBLE_DEVICES="0"))
    assert proc.returncode == 1
    bad = [r for r in rows_of(report, "fail") if r["check"] == "device"]
    assert bad and "ranks 0-1 all use GPU 0" in bad[0]["found"], report["rows"]
    assert "Duplicate GPU" in bad[0]["found"]


@pytest.mark.timeout(150)
def test_a_small_shm_and_a_full_checkpoint_dir_fail(tmp_path):
    with small_disk(tmp_path / "shm", "64m") as shm, small_disk(tmp_path / "ckpt", "8m") as ckpt:
        _fill(ckpt / "filler")
        proc, report = check(["--nproc", "2", "--no-sweep", "--checkpoint-dir", str(ckpt)],
                             env=_env(DISTDOCTOR_CHECK_SHM=str(shm)))
    assert proc.returncode == 1
    bad = {r["check"]: r for r in rows_of(report, "fail")}
    assert "64.0 MiB" in bad["/dev/shm"]["found"] and "--shm-size" in bad["/dev/shm"]["remedy"]
    assert bad["checkpoint dir"]["found"].startswith(str(ckpt)), bad["checkpoint dir"]
    assert "No space left" in bad["checkpoint dir"]["found"], bad["checkpoint dir"]


def _fill(path: Path) -> None:
    """Write until the file system is full."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, b"\0" * (1 << 16)):
            pass
    except OSError:
        pass  # ENOSPC: full
    finally:
        os.close(fd)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("address, says", [
    ("no-such-host.invalid", "does not resolve"),
    ("127.0.0.1", "nothing answered there for 3 s"),  # a worker node; no first node
])
def test_an_unreachable_rendezvous_fails_before_any_rank_starts(address, says):
    proc, report = check(["--timeout", "3", "--", sys.executable, "-m",
                          "torch.distributed.run", "--nnodes", "2", "--node-rank", "1",
                          "--nproc-per-node", "2", "--master-addr", address,
                          "--master-port", str(free_port()), "train.py"], env=_env())
    assert proc.returncode == 1
    bad = rows_of(report, "fail")
    assert bad[0]["check"] == "rendezvous reachable" and bad[0]["scope"].startswith(address)
    assert says in bad[0]["found"], bad[0]
    assert [r["check"] for r in bad] == ["rendezvous reachable", "ranks"], bad
    assert "not started" in bad[1]["found"]


@pytest.mark.timeout(200)
def test_one_node_with_another_nccl_value_fails_on_both_nodes(tmp_path):
    """Two torchrun nodes on this host, the job's own line under `check` on each; node 1
    sets NCCL_DEBUG=INFO where node 0 has WARN."""
    port = free_port()
    procs = []
    for node, level in ((0, "WARN"), (1, "INFO")):
        cmd = [sys.executable, "-m", "distdoctor", "check", "--json", "--", sys.executable,
               "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(node),
               "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port",
               str(port), "train.py", "--lr", "0.1"]
        procs.append(subprocess.Popen(cmd, env=_env(NCCL_DEBUG=level), stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                      text=True, start_new_session=True))
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=150))
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
    for (out, err), p in zip(outs, procs, strict=True):
        assert p.returncode == 1, err[-2000:]
        report = json.loads(out)
        assert report["world_size"] == 4
        bad = [r for r in rows_of(report, "fail") if r["check"] == "same settings"]
        assert bad and bad[0]["scope"] in ("ranks 0-1", "ranks 2-3"), report["rows"]
        assert "NCCL_DEBUG=" in bad[0]["found"] and "on rank" in bad[0]["found"]


@pytest.mark.timeout(150)
def test_gpu_health_through_replayed_nvml_readings_and_kernel_log():
    """NVML's state now, and the Xids the driver logged before the check (a constructed
    kernel log, read as /dev/kmsg is: tests/fixtures/kmsg/README.md)."""
    proc, report = check(["--nproc", "2", "--no-sweep"], env=_env(
        DISTDOCTOR_NVML_REPLAY=str(FIXTURES / "h100_hw_thermal.json"),
        DISTDOCTOR_KMSG_REPLAY=str(FIXTURES.parent / "kmsg" / "xids.kmsg")))
    xids = {r["found"].split(" (")[0]: r for r in rows_of(report)
            if r["check"] == "GPU kernel log"}
    assert sorted(xids) == ["Xid 13", "Xid 48", "Xid 79", "Xid 94"], xids  # 31: old, an app's
    assert xids["Xid 79"]["status"] == "fail" and proc.returncode == 1
    assert ("on GPU 2 (0000:38:00), 2 times, last 2.0 h ago: GPU has fallen off the bus"
            in xids["Xid 79"]["found"])
    assert "on GPU 4 (0000:58:00)" in xids["Xid 94"]["found"]  # the MIG form
    assert {xids[x]["status"] for x in ("Xid 13", "Xid 48", "Xid 94")} == {"warn"}
    gpu = [r for r in report["rows"] if r["check"] == "GPU health"]
    assert len({r["scope"] for r in gpu}) == 8, gpu  # the fixture's 8 GPUs, one node
    hot = [r for r in gpu if r["scope"].endswith("GPU 6")]
    assert hot and hot[0]["status"] in ("warn", "fail"), gpu
    assert all("(replayed NVML readings)" in r["found"] for r in gpu)  # never shown as live
    assert "hw_thermal" in " ".join(r["found"] for r in hot) or "C" in hot[0]["found"]


@pytest.mark.timeout(150)
def test_a_slow_link_is_named_by_the_sweep():
    proc, report = check(["--nproc", "3"], env=_env(DISTDOCTOR_TEST_SEND_DELAY_MS="2:40"))
    slow = [r for r in rows_of(report, "warn") if r["check"] == "pairwise bandwidth"]
    # only rank 2's sends: a healthy pair that dipped in a sweep was measured again
    assert {r["scope"] for r in slow} == {"pair 2->0", "pair 2->1"}, report["rows"]


def test_the_sweep_measures_again_the_pairs_below_half_the_median():
    from distdoctor.check.links import slow_pairs

    healthy = [[0, 3.0, 3.2], [2.9, 0, 3.1], [3.3, 3.0, 0]]
    assert slow_pairs(healthy) == []
    one_way = [[0, 1.2, 3.2], [2.9, 0, 3.1], [3.3, 3.0, 0]]  # 0 -> 1 only
    assert slow_pairs(one_way) == [(0, 1)]  # both directions are measured again
    sender = [[0, 3.0, 3.2], [2.9, 0, 3.1], [1.0, 1.1, 0]]  # rank 2's sends
    assert slow_pairs(sender) == [(0, 2), (1, 2)]
    assert slow_pairs([[0.0]]) == []  # one rank: no pairs


@pytest.mark.timeout(60)
def test_bad_input_gets_one_line():
    for args, words in ((["check"], "--nproc N or"), (["check", "--nproc", "0"], "at least 1"),
                        (["check", "--", "srun", "python", "t.py"], "torchrun line"),
                        (["check", "--nproc", "2", "--", "torchrun", "x.py"], "--nproc N or")):
        proc = run_cli(args, timeout=30)
        assert proc.returncode == 2, (args, proc.stderr)
        assert words in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


@pytest.mark.timeout(150)
def test_the_usual_single_node_torchrun_lines_are_checked():
    """`torchrun --standalone ...` (its own store on a free port) and a line that names
    no rendezvous at all (torchrun's defaults) — the forms most scripts' READMEs give."""
    from distdoctor.check.preflight import rendezvous_of

    assert rendezvous_of(["torchrun", "--nproc-per-node", "2", "train.py"], {}) == (
        "127.0.0.1", 29500, True)
    proc, report = check(["--no-sweep", "--", "torchrun", "--standalone", "--nproc-per-node",
                          "2", "train.py", "--epochs", "3"], env=_env())
    assert proc.returncode == 0, report["rows"]
    assert report["world_size"] == 2
    port = [r for r in report["rows"] if r["check"] == "rendezvous port"]
    assert port[0]["status"] == "ok" and "--standalone" in port[0]["found"]


@pytest.mark.timeout(150)
@pytest.mark.parametrize("iface, says", [("nosuchif0", "no interface nosuchif0"),
                                         ("ifb0", "has no IP address")])
def test_a_gloo_interface_that_cannot_work_fails_before_any_rank_starts(iface, says):
    """GLOO_SOCKET_IFNAME naming no interface (or one without an address): exit 1, the
    variable named, the node's interfaces listed, a remedy; no rank started, no traceback."""
    import socket as _socket

    if iface == "ifb0" and "ifb0" not in {n for _, n in _socket.if_nameindex()}:
        pytest.skip("no address-less interface on this machine")
    proc, report = check(["--nproc", "2"], env=_env(GLOO_SOCKET_IFNAME=iface))
    assert proc.returncode == 1
    bad = rows_of(report, "fail")
    setting = [r for r in bad if r["check"] == "setting valid"]
    assert setting and setting[0]["found"].startswith(f"GLOO_SOCKET_IFNAME='{iface}'"), bad
    assert says in setting[0]["found"] and "GLOO_SOCKET_IFNAME" in setting[0]["remedy"]
    if iface == "nosuchif0":
        assert "lo" in setting[0]["found"]  # what the node does have
    ranks = [r for r in bad if r["check"] == "ranks"]
    assert ranks and "not started" in ranks[0]["found"] and "GLOO_SOCKET_IFNAME" in \
        ranks[0]["found"]
    assert "Traceback" not in proc.stderr and "RuntimeError" not in proc.stdout
    table = run_cli(["check", "--nproc", "2"], timeout=120,
                    env=_env(GLOO_SOCKET_IFNAME=iface))
    assert table.returncode == 1 and "? ranks" not in table.stdout
    assert "no rank ran" in table.stdout, table.stdout


@pytest.mark.timeout(150)
def test_when_the_checks_own_ranks_fail_the_log_diagnosis_names_the_cause(monkeypatch):
    """The local checks are passed by (a node whose variable differs from the others'
    would be the real case): the ranks' own output goes through the log diagnosis, so the
    failure names the variable and its remedy, not gloo's raw enforce message."""
    from distdoctor.check.launch import run_ranks

    for k in list(os.environ):
        if k.startswith(("NCCL_", "GLOO_", "MASTER_")):
            monkeypatch.delenv(k)
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "nosuchif0")
    job, failure, remedy = run_ranks(2, None, None, False, 90)
    assert job is None
    assert failure.startswith("the check's ranks failed: GLOO_SOCKET_IFNAME=nosuchif0"), failure
    assert "enforce fail" not in failure and "GLOO_SOCKET_IFNAME" in remedy
