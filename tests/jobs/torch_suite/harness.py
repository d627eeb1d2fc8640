"""Run tests of dist_suite.py bare or under `distdoctor run`, and read back what happened.

Shared by tests/test_torch_suite.py (the CI subset) and benchmarks/torch_suite.py (the
wider run). Imports no torch: the suite runs in subprocesses, each test spawning its own
rank processes, so one traced run dir holds one incarnation per test that spawned ranks.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

SUITE = Path(__file__).with_name("dist_suite.py")
# the class in dist_suite.py that holds the tests
CLASS = "TestGloo"

# The CI subset (tests/test_torch_suite.py): each family once, each test a few seconds
# bare on 2 cores (per test: two fresh interpreters importing torch's test base, ~4 s).
# The op counts each rank issues (summed over groups) were counted by torch's dispatcher in
# a bare run (dist_suite.CountC10dOps) and agree with the tests' source: one all_reduce,
# gather... per source rank (2 ranks), 6 CPU dtypes x 2 sources of broadcast, ...
CI_COUNTS: dict[str, tuple[dict, dict] | None] = {  # test -> (rank 0's, rank 1's)
    "test_all_reduce_sum": ({"all_reduce": 2}, {"all_reduce": 2}),
    "test_all_reduce_sum_async": ({"all_reduce": 2}, {"all_reduce": 2}),  # Work.wait()
    "test_broadcast": ({"broadcast": 12}, {"broadcast": 12}),
    "test_gather": ({"gather": 2}, {"gather": 2}),  # rooted: the gather list on dst only
    "test_send_recv": ({"send": 1, "recv": 1}, {"send": 1, "recv": 1}),
    "test_send_recv_any_source": ({"send": 2, "recv_anysource": 2},
                                  {"send": 2, "recv_anysource": 2}),
    "test_isend": ({"send": 1}, {"recv": 1}),  # rank 0 isend()s, rank 1 recv()s
    "test_all_reduce_full_group_sum": ({"all_reduce": 2}, {"all_reduce": 2}),  # new_group
    # new_group; rank 0's monitored barrier times out on purpose (rank 1 stays away)
    "test_monitored_barrier_gloo_subgroup": ({"monitored_barrier": 1}, {}),
    # 5 DDP steps: construction's param check (all_gather) and state sync (broadcast),
    # one gradient bucket all_reduce per step (from DDP's C++ reducer)
    "test_DistributedDataParallelCPU": ({"all_gather": 1, "broadcast": 5, "all_reduce": 5},
                                        {"all_gather": 1, "broadcast": 5, "all_reduce": 5}),
    # skipped inside the ranks (world size 2 is too small): ranks start, issue nothing
    "test_all_reduce_group_sum": ({}, {}),
    # skipped in the parent (gloo has no CPU all_to_all): no ranks at all
    "test_all_to_all": None,
}
CI_OUTCOMES = {t: "skip" if t in ("test_all_reduce_group_sum", "test_all_to_all") else "pass"
               for t in CI_COUNTS}

# each test's own limit (torch's MultiProcessTestCase joins its ranks for this long, then
# kills them and fails the test): a hung test fails alone instead of stopping the run
TEST_ENV = {"DISTRIBUTED_TESTS_DEFAULT_TIMEOUT": "60", "PYTHONUNBUFFERED": "1"}


@dataclass
class SuiteRun:
    outcomes: dict[str, str]  # test -> pass | skip | fail | missing
    times: dict[str, float]  # test -> seconds (pytest's, per test)
    messages: dict[str, str]  # test -> failure or skip message
    returncode: int
    wall_s: float
    stdout: str
    stderr: str
    left_behind: list[str]  # processes of the run alive after it returned (then killed)
    records: dict[int, tuple[str, int]] = field(default_factory=dict)  # pid -> (test, rank)
    counts: dict[str, dict[int, dict]] = field(default_factory=dict)  # counted in the ranks


def run_suite(tests: list[str], work: Path, run_dir: Path | None = None, count: bool = False,
              timeout: float = 600) -> SuiteRun:
    """Run TESTS with pytest in one process (under `distdoctor run --run-dir RUN_DIR` when
    given); each rank writes its pid (and, with COUNT, its op counts) into WORK/records."""
    work = work.resolve()  # the records path marks the run's processes (_kill_leftovers)
    work.mkdir(parents=True, exist_ok=True)
    records, junit, tmp = work / "records", work / "junit.xml", work / "tmp"
    records.mkdir(exist_ok=True)
    tmp.mkdir(exist_ok=True)  # torch's test base leaves a temporary file per test
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
           f"--junitxml={junit}", *(f"{SUITE}::{CLASS}::{t}" for t in tests)]
    if run_dir is not None:
        cmd = [sys.executable, "-m", "distdoctor", "run", "--run-dir", str(run_dir), "--",
               *cmd]
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISTDOCTOR")}
    env.update(TEST_ENV, DIST_SUITE_RECORD=str(records), DIST_SUITE_COUNT=str(int(count)),
               TMPDIR=str(tmp))
    start = time.monotonic()
    out, err, rc, left = _run(cmd, env, timeout, work)
    wall = time.monotonic() - start
    outcomes, times, messages = read_junit(junit, tests)
    run = SuiteRun(outcomes, times, messages, rc, wall, out, err, left)
    for path in records.glob("*.json"):
        rec = json.loads(path.read_text())
        run.records[rec["pid"]] = (rec["test"], rec["rank"])
        if rec["counts"] is not None:
            run.counts.setdefault(rec["test"], {})[rec["rank"]] = rec["counts"]
    return run


def _run(cmd, env, timeout, cwd) -> tuple[str, str, int, list[str]]:
    """Run CMD in its own session, no stdin: its output, exit code and the processes it
    left behind (killed). On timeout stop it (SIGTERM, then SIGKILL to its process group)
    and every process it left, then fail loudly."""
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        left = _kill_leftovers(cwd / "records", grace=5)  # none, unless something outlived it
        return out.decode(errors="replace"), err.decode(errors="replace"), proc.returncode, left
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)  # distdoctor run stops its job on SIGTERM
        try:
            out, err = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
        raise TimeoutError(f"{' '.join(cmd[:6])} ... timed out after {timeout} s\n"
                           f"{out.decode(errors='replace')[-3000:]}\n"
                           f"{err.decode(errors='replace')[-3000:]}") from None
    finally:
        _kill_leftovers(cwd / "records")  # also when interrupted


def _kill_leftovers(records: Path, grace: float = 0) -> list[str]:
    """Kill every process started for this run still alive after GRACE seconds, and say
    which: they all carry its unique DIST_SUITE_RECORD in their environment (pids alone
    could have been reused, and distdoctor may move a wrapped command's processes to
    another group). The grace: multiprocessing's resource tracker outlives pytest a little."""
    marker = f"DIST_SUITE_RECORD={records}\0".encode()
    deadline = time.monotonic() + grace
    while True:
        alive = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            try:
                if marker in (entry / "environ").read_bytes():
                    cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
                    alive[int(entry.name)] = cmd.decode(errors="replace")[:200]
            except OSError:
                pass
        if not alive or time.monotonic() >= deadline:
            break
        time.sleep(0.2)
    for pid in alive:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return [f"{pid} {cmd}" for pid, cmd in alive.items()]


def read_junit(path: Path, tests: list[str]):
    outcomes = {t: "missing" for t in tests}  # pytest died before writing it
    times: dict[str, float] = {}
    messages: dict[str, str] = {}
    if not path.exists():
        return outcomes, times, messages
    for case in ET.parse(path).iter("testcase"):
        name = case.get("name")
        outcome, message = "pass", ""
        for tag, what in (("skipped", "skip"), ("failure", "fail"), ("error", "fail")):
            node = case.find(tag)
            if node is not None:
                outcome, message = what, node.get("message") or (node.text or "")
                break
        outcomes[name], times[name], messages[name] = outcome, float(case.get("time")), message
    return outcomes, times, messages


def traced_runs(run_dir: Path, records: dict[int, tuple[str, int]]):
    """test -> its incarnations (runlog Runs; a test that re-creates the default group
    has several), found by their ranks' pids; and the incarnations no test claimed, with
    the tests their pids name and what was unreadable."""
    from distdoctor.runlog.run import read_incarnations

    runs: dict[str, list] = {}
    stray = []
    for run in read_incarnations(run_dir):
        if not run.headers and not run.unreadable:
            continue  # no rank started: the reader's one empty incarnation
        tests = {records.get(h.pid, (None,))[0] for h in run.headers.values()}
        if len(tests) != 1 or None in tests or run.unreadable:
            stray.append((run.incarnation, sorted(map(str, tests)), dict(run.unreadable)))
        else:
            runs.setdefault(tests.pop(), []).append(run)
    return runs, stray


def op_counts(runs) -> dict[int, dict[str, int]]:
    """rank -> {op: how many} over a test's incarnations, whatever the group and outcome."""
    counts: dict[int, collections.Counter] = {}
    for run in runs:
        for rank, events in run.events.items():
            counts.setdefault(rank, collections.Counter()).update(
                e.op for e in events if e.kind != "span")
    return {rank: dict(c) for rank, c in counts.items()}
