"""`distdoctor nccl-test` end to end: real gloo jobs of 1, 2, 3 and 4 ranks on CPU.

Every job runs in its own session with a deadline; on a timeout the whole session (the
launcher and its ranks) is killed before the test fails, so no rank outlives a test.
Timings are never asserted: only the table's shape, counts, checks and flags.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from distdoctor.nccltest.ops import OPS, bandwidths, layout
from distdoctor.nccltest.options import DTYPES

JOB_TIMEOUT = 75


def run_job(argv: list[str], env: dict | None = None, timeout: float = JOB_TIMEOUT):
    """Run a command in a new session; kill the session on timeout. (rc, stdout, stderr)"""
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    full_env.pop("RANK", None)
    full_env.pop("WORLD_SIZE", None)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=full_env, start_new_session=True, stdin=subprocess.DEVNULL)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"job timed out after {timeout}s: {argv}\n{out}\n{err}")
    return proc.returncode, out, err


def nccl_test(*args: str, env: dict | None = None):
    return run_job([sys.executable, "-m", "distdoctor", "nccl-test", *args], env)


def table_rows(out: str) -> list[list[str]]:
    return [line.split() for line in out.splitlines() if line and not line.startswith("#")]


def sections(out: str) -> dict[str, list[list[str]]]:
    """Rows of the table, per op."""
    per, op = {}, None
    for line in out.splitlines():
        if line.startswith("# Collective test: "):
            op = line.split(": ")[1].strip()
            per[op] = []
        elif line and not line.startswith("#") and op:
            per[op].append(line.split())
    return per


def assert_consistent(result: dict, op: str, nranks: int) -> None:
    """algbw and busbw in the JSON follow from size, count and time as nccl-tests says."""
    spec = OPS[op]
    lay = layout(spec, result["size"], DTYPES[result["type"]][1], nranks)
    assert (lay.size, lay.count) == (result["size"], result["count"])
    for place in ("out_of_place", "in_place"):
        p = result[place]
        if p is None:
            continue
        assert len(p["rank_time_us"]) >= nranks
        alg, bus = bandwidths(spec, lay, p["time_us"] / 1e6)
        assert p["algbw_gbps"] == pytest.approx(alg) and p["busbw_gbps"] == pytest.approx(bus)
        assert p["wrong"] == 0


@pytest.mark.timeout(90)
def test_two_ranks_every_op_prints_the_table_and_its_twins(tmp_path):
    js, cs = tmp_path / "r.json", tmp_path / "r.csv"
    rc, out, err = nccl_test("all", "--nproc", "2", "-b", "1K", "-e", "64K", "-f", "8",
                             "-n", "2", "-w", "1", "--json", str(js), "--csv", str(cs))
    assert rc == 0, err
    per = sections(out)
    assert list(per) == list(OPS)
    for op, rows in per.items():
        assert len(rows) == 3, op  # 1K, 8K, 64K
        for row in rows:
            assert len(row) == 13  # size count type redop root + 2 x (time algbw busbw #wrong)
            assert row[2] == "float" and row[3] == ("sum" if OPS[op].has_redop else "none")
            checked = [row[8]] * OPS[op].out_of_place + [row[12]] * OPS[op].in_place
            assert checked and all(w == "0" for w in checked)
            if not OPS[op].out_of_place:
                assert row[5:9] == ["N/A"] * 4
            if not OPS[op].in_place:
                assert row[9:13] == ["N/A"] * 4
    assert out.count("# Out of bounds values : 0 OK") == len(OPS)
    assert out.count("# Avg bus bandwidth    : ") == len(OPS)
    assert out.count("#  Rank ") == 2 and "backend gloo" in out
    data = json.loads(js.read_text())
    assert data["ok"] is True and data["world_size"] == 2
    assert [t["op"] for t in data["tests"]] == list(OPS)
    for test in data["tests"]:
        for result in test["results"]:
            assert_consistent(result, test["op"], 2)
    csv_lines = cs.read_text().splitlines()
    assert len(csv_lines) == 1 + sum(len(t["results"]) for t in data["tests"])


@pytest.mark.timeout(90)
def test_four_ranks_every_root_dtype_and_redop_checks_out(tmp_path):
    js = tmp_path / "r.json"
    rc, out, err = nccl_test("all_reduce", "reduce_scatter", "reduce", "scatter", "--nproc",
                             "4", "-b", "4K", "-e", "4K", "-r", "all", "-d", "int32,bfloat16",
                             "-o", "sum", "-n", "1", "-w", "1", "-a", "3", "--json", str(js))
    assert rc == 0, err + out
    data = json.loads(js.read_text())
    by_op = {t["op"]: t["results"] for t in data["tests"]}
    assert {r["root"] for r in by_op["reduce"]} == {0, 1, 2, 3}
    assert {(r["type"], r["redop"]) for r in by_op["all_reduce"]} == {
        ("int32", "sum"), ("bfloat16", "sum")}
    assert len(by_op["scatter"]) == 2 * 4  # 2 dtypes x 4 roots
    for op, results in by_op.items():
        for result in results:
            assert result["nranks"] == 4
            assert_consistent(result, op, 4)
            # -a 3: the reported time is the slowest rank's
            for place in (result["out_of_place"], result["in_place"]):
                if place:
                    assert place["time_us"] == pytest.approx(max(place["rank_time_us"]))


CORRUPTING_RANK = textwrap.dedent("""
    import sys
    from distdoctor.nccltest import collectives, worker

    real = collectives.BUILDERS["all_gather"]

    def corrupting(call):
        prep = real(call)
        issue = prep.issue
        def issue_then_corrupt():
            works = issue()
            for work in works:
                work.wait()
            if call.rank == 1:
                prep.result[::7] += 1  # as if a link flipped bits on the way to rank 1
            return []
        prep.issue = issue_then_corrupt
        return prep

    collectives.BUILDERS["all_gather"] = corrupting
    sys.exit(worker.main())
""")


@pytest.mark.timeout(60)
def test_a_corrupted_result_is_counted_and_fails_the_run(tmp_path):
    rank_script = tmp_path / "rank.py"
    rank_script.write_text(CORRUPTING_RANK)
    launcher = textwrap.dedent(f"""
        import sys
        from distdoctor.nccltest.launch import launch
        from distdoctor.nccltest.options import Options
        opts = Options(ops=["all_gather"], minbytes=4096, maxbytes=4096, iters=2,
                       warmup_iters=1, json_path={str(tmp_path / "r.json")!r})
        sys.exit(launch(opts, 2, [sys.executable, {str(rank_script)!r}]))
    """)
    rc, out, err = run_job([sys.executable, "-c", launcher])
    assert rc == 1, err
    row = table_rows(out)[0]
    # 4096 B: 512 floats per rank, 1024 gathered; every 7th of rank 1's is off by one
    assert row[:2] == ["4096", "512"]
    assert row[8] == row[12] == str(len(range(0, 1024, 7)))
    assert "# Out of bounds values : 2 FAILED" in out
    assert json.loads((tmp_path / "r.json").read_text())["ok"] is False


@pytest.mark.timeout(90)
def test_pairwise_finds_the_rank_whose_sends_are_slowed(tmp_path):
    js = tmp_path / "p.json"
    rc, out, err = nccl_test("--pairwise", "--nproc", "3", "-e", "64K", "-n", "3", "-w", "1",
                             "--json", str(js), env={"DISTDOCTOR_TEST_SEND_DELAY_MS": "2:40"})
    assert rc == 1, err  # a slow pair fails the run
    data = json.loads(js.read_text())["pairwise"]
    slow = {(p["src"], p["dst"]) for p in data["slow_pairs"]}
    assert {(2, 0), (2, 1)} <= slow
    assert any(s["rank"] == 2 and "all 2 of its sends are slow" in s["reasons"]
               for s in data["suspects"])
    assert "# Suspect: rank 2 (" in out
    assert len(data["bandwidth_gbps"]) == 3 and data["bandwidth_gbps"][0][1] > 0


@pytest.mark.timeout(90)
def test_split_per_rail_runs_parallel_groups(tmp_path):
    js = tmp_path / "s.json"
    hosts = "0:nodeA,1:nodeA,2:nodeB,3:nodeB"  # two 2-rank "nodes" on this machine
    rc, out, err = nccl_test("all_reduce", "--nproc", "4", "--split", "rail", "-b", "16K",
                             "-e", "16K", "-n", "2", "-w", "1", "--json", str(js),
                             env={"DISTDOCTOR_TEST_HOSTS": hosts})
    assert rc == 0, err
    data = json.loads(js.read_text())
    assert [r["group"] for r in data["ranks"]] == [0, 1, 0, 1]
    assert [r["host"] for r in data["ranks"]] == ["nodeA", "nodeA", "nodeB", "nodeB"]
    result = data["tests"][0]["results"][0]
    assert result["nranks"] == 2  # each rail group holds one rank per node
    assert_consistent(result, "all_reduce", 2)
    groups = result["in_place"]["groups"]
    assert [g["ranks"] for g in groups] == [[0, 2], [1, 3]]
    assert "# Split groups" in out and "split: rail (2 groups)" in out


@pytest.mark.skipif(open("/proc/sys/vm/overcommit_memory").read().strip() == "1",
                    reason="with overcommit always on, a 1 TiB allocation would succeed")
@pytest.mark.timeout(60)
def test_a_size_that_does_not_fit_is_skipped_and_the_sweep_goes_on():
    rc, out, err = nccl_test("all_reduce", "--nproc", "2", "-b", "1M", "-e", "1T", "-f",
                             "1048576", "-n", "1", "-w", "0")
    assert rc == 0, err
    assert "# all_reduce float sum: skipping 1099511627776 B: out of memory" in out
    assert [row[0] for row in table_rows(out)] == ["1048576"]


@pytest.mark.timeout(60)
def test_one_process_runs_as_a_world_of_one():
    rc, out, err = nccl_test("all_reduce", "broadcast", "-b", "4K", "-e", "4K", "-n", "1",
                             "-w", "0")
    assert rc == 0, err
    rows = table_rows(out)
    assert len(rows) == 2 and "1 rank" in out
    assert rows[0][11] == "0.00"  # all_reduce busbw factor 2(n-1)/n is 0 for n = 1


@pytest.mark.timeout(60)
def test_under_torchrun_each_rank_runs_the_command_and_rank_0_prints():
    rc, out, err = run_job([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node",
                            "2", "-m", "distdoctor", "nccl-test", "sendrecv", "-b", "64K",
                            "-e", "64K", "-n", "2", "-w", "1"])
    assert rc == 0, err
    assert out.count("# Collective test: sendrecv") == 1 and out.count("#  Rank ") == 2
    assert table_rows(out)[0][8] == "0"


@pytest.mark.timeout(30)
def test_launcher_stops_the_other_ranks_when_one_fails(tmp_path):
    from distdoctor.nccltest.launch import launch
    from distdoctor.nccltest.options import Options
    pid_file = tmp_path / "pid"
    code = ("import os, sys, time\n"
            "if os.environ['RANK'] == '1': sys.exit(3)\n"
            f"open({str(pid_file)!r}, 'w').write(str(os.getpid()))\n"
            "time.sleep(120)\n")
    start = time.monotonic()
    assert launch(Options(), 2, [sys.executable, "-c", code], grace_s=0.5) == 3
    assert time.monotonic() - start < 20
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
