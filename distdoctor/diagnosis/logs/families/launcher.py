"""Launchers' reports of their ranks: torchrun/torchelastic (the one-line `failed (exitcode:
...)` and the ChildFailedError table), DeepSpeed's, mpirun's and srun's, the launcher being
stopped, and the survivors it tears down (never a cause)."""

from __future__ import annotations

import re

from distdoctor.diagnosis.findings import Finding
from distdoctor.diagnosis.logs import remedies as R
from distdoctor.diagnosis.logs.lines import LogLine
from distdoctor.diagnosis.logs.problems import Problem
from distdoctor.diagnosis.logs.signals import CAUSE, CONTEXT, EXIT, TEARDOWN, Family, Signal, rule
from distdoctor.launch.reaper import signal_name

NAME = "launcher"

RULES = (
    # torchrun, glog (2.4+) and logging (older) heads alike: the head is peeled by the reader
    rule("rank_failed", NAME, EXIT,
         r"failed \(exitcode: (?P<exit_code>-?\d+)\) local_rank: (?P<local_rank>\d+) "
         r"\(pid: (?P<pid>\d+)\)", ints=("exit_code", "local_rank", "pid")),
    rule("teardown", NAME, TEARDOWN,
         r"Sending process (?P<pid>\d+) closing signal (?P<sig>SIG\w+)", ints=("pid",)),
    rule("launcher_signaled", NAME, CAUSE,
         r"SignalException: Process (?P<pid>\d+) got signal: (?P<signum>\d+)|"
         r"Received (?:Signals\.)?(?P<signame>SIG\w+|\d+) death signal, shutting down workers",
         ints=("pid", "signum")),
    rule("restart", NAME, CONTEXT,
         r"Worker group FAILED\. (?P<left>\d+)/(?P<max>\d+) attempts left", ints=("left", "max")),
    # DeepSpeed's launcher
    rule("rank_failed", NAME, EXIT,
         r"--local_rank=(?P<local_rank>\d+).*?exits with return code = (?P<exit_code>-?\d+)",
         ints=("local_rank", "exit_code")),
    # Accelerate / subprocess launchers: which rank is not said
    rule("process_failed", NAME, EXIT,
         r"died with <Signals\.(?P<sig>SIG\w+): (?P<signum>\d+)>|"
         r"returned non-zero exit status (?P<exit_code>-?\d+)", ints=("signum", "exit_code")),
    # Open MPI
    rule("rank_failed", NAME, EXIT,
         r"process rank (?P<rank>\d+) with PID (?P<pid>\d+) on node (?P<host>\S+) exited on "
         r"signal (?P<signum>\d+)", ints=("rank", "pid", "signum")),
    # Slurm: one task per rank, or one per node under torchrun (the reasoning tells them apart)
    rule("task_failed", NAME, EXIT,
         r"srun: error: (?P<host>[\w.-]+): task(?:s)? (?P<task>\d+): (?:(?P<killed>Killed)|"
         r"(?P<aborted>Aborted)|Exited with exit code (?P<exit_code>\d+))",
         ints=("task", "exit_code")),
)

# an entry's fields (its "time" is left out: the reader need not hand it over)
_TABLE = re.compile(r"^\s*(?P<key>host|rank|exitcode|error_file|traceback)\s*:\s?(?P<v>.*)$")
_TABLE_RANK = re.compile(r"(?P<rank>\d+) \(local_rank: (?P<local>\d+)\)")
_TABLE_EXIT = re.compile(r"(?P<code>-?\d+) \(pid: (?P<pid>\d+)\)")
_TABLE_SIGNAL = re.compile(r"Signal (?P<signum>\d+) \((?P<name>SIG\w+)\)")


class LauncherFamily(Family):
    name = NAME
    anchors = (b"exitcode", b"closing signal", b"got signal", b"death signal",
               b"attempts left", b"return code", b"died with <Signals",
               b"non-zero exit status", b"exited on signal", b"srun: error",
               b"Root Cause", b"Failures:", b"local_rank:",
               b"host      :", b"error_file", b"traceback :")
    rules = RULES

    def __init__(self):
        self._root = False
        self._entry: dict = {}
        self._entry_line: LogLine | None = None

    def feed(self, line: LogLine) -> list[Signal]:
        text = line.text
        if "Root Cause (first observed failure)" in text:
            return self._close() + self._section(True)
        if text.strip() == "Failures:":
            return self._close() + self._section(False)
        m = _TABLE.match(text)
        if m:
            return self._table_field(line, m["key"], m["v"].strip())
        return self._close() + super().feed(line)

    def _section(self, root: bool) -> list[Signal]:
        self._root = root
        return []

    def _table_field(self, line: LogLine, key: str, v: str) -> list[Signal]:
        out = []
        if key in self._entry:  # a new entry begins
            out = self._close()
        e = self._entry
        if self._entry_line is None:
            self._entry_line = line
        if key == "host":
            e["host"] = v
        elif key == "rank" and (m := _TABLE_RANK.search(v)):
            e["rank"], e["local_rank"] = int(m["rank"]), int(m["local"])
        elif key == "exitcode" and (m := _TABLE_EXIT.search(v)):
            e["exit_code"], e["pid"] = int(m["code"]), int(m["pid"])
        elif key == "traceback":
            if m := _TABLE_SIGNAL.search(v):
                e["signum"] = int(m["signum"])
            e["traceback"] = v[:200]
            out += self._close()
        else:
            e[key] = v
        return out

    def _close(self) -> list[Signal]:
        out = self.pending()
        self._entry, self._entry_line = {}, None
        return out

    def pending(self) -> list[Signal]:
        e, line = self._entry, self._entry_line
        if line is None or "exit_code" not in e:
            return []
        return [Signal("rank_failed", NAME, EXIT, line, {**e, "root_cause": self._root,
                                                         "table": True})]


# --- what its problems mean ---------------------------------------------------------------
def describe(p: Problem, ctx) -> Finding:
    """The launcher itself stopped (the only CAUSE of this family)."""
    f = p.first.fields
    sig = f.get("signame") or (signal_name(f["signum"]) if "signum" in f else "a signal")
    return ctx.finding(p, "crash", "error", f"the launcher itself received {sig} and stopped "
                       f"the ranks", [], R.LAUNCHER_SIGNALED)


def collect_exits(signals: list[Signal], teardown_pids: set[int]) -> dict[int, dict]:
    """Each failed rank's exit as its launcher reported it, by rank (the earliest report, a
    root-cause entry over others). A launcher that does not say which rank gets a negative
    key; one node's local rank stands for the rank."""
    hosts = {s.fields.get("host") for s in signals if s.fields.get("host")}
    out: dict[int, dict] = {}
    for i, s in enumerate(signals):
        f = dict(s.fields)
        rank = f.get("rank")
        if rank is None and s.rule == "process_failed":
            rank = -1 - i
        if rank is None and s.rule == "task_failed":
            rank = f.get("task")
        if rank is None and len(hosts) <= 1:
            rank = f.get("local_rank")
        if rank is None:
            continue
        if f.get("killed"):
            f["signum"] = 9
        if f.get("aborted"):
            f["signum"] = 6
        code = f.get("exit_code")
        if code is not None and code < 0:
            f["signum"] = -code
        f["rank"], f["order"] = rank, s.order
        f["torn_down"] = f.get("pid") in teardown_pids or f.get("signum") == 15
        prev = out.get(rank)
        if prev is None or (f.get("root_cause") and not prev.get("root_cause")):
            if prev:
                f["order"] = min(prev["order"], f["order"])
            out[rank] = {**(prev or {}), **f}
        out[rank].setdefault("line", s.line)
    return out


def describe_exit(e: dict) -> tuple[str, str, str]:
    """(summary, family, remedy) of an exit nothing else in the log explains."""
    rank = e["rank"]
    host = f" on {e['host']}" if e.get("host") else ""
    who = f"rank {rank}" if rank >= 0 else "a rank (the launcher does not say which)"
    if e.get("signum") == 9:
        return (f"{who}{host} was killed by SIGKILL with no traceback: most likely the host's "
                f"OOM killer", "oom", R.HOST_OOM)
    if e.get("signum") == 7:
        return (f"{who}{host} was killed by SIGBUS: most often /dev/shm is full (DataLoader "
                f"workers, NCCL)", "oom", R.SHM_DATALOADER)
    return (f"{who}{host} {how_it_ended(e)} first, with no traceback in this log", NAME,
            R.PEER_GONE.replace("A peer process went away mid-collective: the", "The"))


def how_it_ended(e: dict) -> str:
    if e.get("signum") == 6:  # C++ terminate() or abort() in the process itself
        return "exited by abort (SIGABRT)"
    if e.get("signum"):
        return f"was killed by {signal_name(e['signum'])}"
    return f"exited with code {e.get('exit_code')}"
