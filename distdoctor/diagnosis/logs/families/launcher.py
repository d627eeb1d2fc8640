"""Launchers' reports of their ranks: torchrun/torchelastic (the one-line `failed (exitcode:
...)` and the ChildFailedError table), DeepSpeed's, mpirun's and srun's, the launcher being
stopped, and the survivors it tears down (never a cause)."""

from __future__ import annotations

import re
import signal as _signal

from distdoctor.diagnosis.logs.lines import LogLine
from distdoctor.diagnosis.logs.signals import (
    CAUSE, CONTEXT, EXIT, TEARDOWN, Family, Signal, rule)

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


def signal_name(signum: int) -> str:
    try:
        return _signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


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
