"""Launchers' reports of their ranks: torchrun/torchelastic (the one-line `failed (exitcode:
...)` and the ChildFailedError table), DeepSpeed's, mpirun's and srun's, the launcher being
stopped, and the survivors it tears down (never a cause)."""

from __future__ import annotations

import re
import signal

from distdoctor.exits import signal_name
from distdoctor.findings import Finding
from distdoctor.logs import remedies as R
from distdoctor.logs.bounds import small_int
from distdoctor.logs.families.oom import SHELL_KILLED
from distdoctor.logs.lines import LogLine
from distdoctor.logs.problems import Problem
from distdoctor.logs.signals import (
    CAUSE,
    CONTEXT,
    EXIT,
    TEARDOWN,
    Family,
    Signal,
    rule,
    short_of,
)

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
    rule("membership", NAME, CONTEXT,
         r"Detected (?P<new>\d+) new nodes? from group_rank=(?P<group_rank>\d+); will restart",
         ints=("new", "group_rank")),
    # DeepSpeed's launcher (launch.py's sigkill_handler): the command it prints is the one its
    # spawn loop left behind, the LAST spawned local rank's, not the failing one's; only the
    # return code is the failing process's. local_rank=0 there means one process was spawned.
    rule("rank_failed", NAME, EXIT,
         r"(?P<last_spawned>)--local_rank=(?P<local_rank>\d+)(?!\d)" + short_of("--local_rank=")
         + r"exits with return code = (?P<exit_code>-?\d+)",
         ints=("local_rank", "exit_code")),
    # DeepSpeed's launch.py when it does not list the command (newer versions, or a cut
    # line): which rank is not said
    rule("process_failed", NAME, EXIT, r"exits with return code = (?P<exit_code>-?[1-9]\d*)",
         ints=("exit_code",)),
    # torchrun's report cut right after its head ("train.py FAILED"): a rank failed, which one
    # and how is cut off
    rule("process_failed", NAME, EXIT, r"^(?P<script>\S+\.py) FAILED\s*$"),
    # Accelerate / subprocess launchers: which rank is not said
    rule("process_failed", NAME, EXIT,
         r"died with <Signals\.(?P<sig>SIG\w+): (?P<signum>\d+)>|"
         r"returned non-zero exit status (?P<exit_code>-?\d+)", ints=("signum", "exit_code")),
    # Lightning's process observer (fabric/strategies/launchers/subprocess_script.py, 2.1 to
    # 2.6), about a process it started (ranks 1..N-1 of its node): which rank is not said
    rule("process_failed", NAME, EXIT,
         r"Child process with PID (?P<pid>\d+) terminated with code (?P<exit_code>-?\d+)",
         ints=("pid", "exit_code")),
    # torch.multiprocessing.spawn's parent, raising its ProcessExitedException (spawn.py,
    # torch 2.4 to 2.15, the same words): the process index, a local rank
    rule("rank_failed", NAME, EXIT,
         r"ProcessExitedException: process (?P<local_rank>\d+) terminated with "
         r"(?:exit code (?P<exit_code>-?\d+)|signal (?P<sig>SIG\w+))",
         ints=("local_rank", "exit_code")),
    # ... and its ProcessRaisedException, the rank's traceback following this line
    rule("rank_failed", NAME, EXIT,
         r"^-- Process (?P<local_rank>\d+) terminated with the following error:",
         ints=("local_rank",)),
    # Open MPI
    rule("rank_failed", NAME, EXIT,
         r"process rank (?P<rank>\d+) with PID (?P<pid>\d+) on node (?P<host>\S+) exited on "
         r"signal (?P<signum>\d+)", ints=("rank", "pid", "signum")),
    # Slurm: one task per rank, or one per node under torchrun (the reasoning tells them apart)
    # (src/srun/launch.c: "%s: %s %s: Exited with exit code %d", strsignal's words, "Out Of
    # Memory"; a set of tasks as "tasks 0-3": its first task stands for them)
    rule("task_failed", NAME, EXIT,
         r"srun: error: (?P<host>[\w.-]+): tasks? (?P<task>\d+)(?P<more>[-,\d]*): "
         r"(?:(?P<killed>Killed|Out Of Memory)|(?P<aborted>Aborted)|(?P<segv>Segmentation fault)|"
         r"(?P<bus>Bus error)|(?P<term>Terminated)|Exited with exit code (?P<exit_code>\d+))",
         ints=("task", "exit_code")),
)

# Lightning's observer, after a child failed: "Forcefully terminating all other processes to
# avoid zombies", then SIGKILL to every process, the shell's own child too; the shell then says
# "Killed" ("./run.sh: line 2:  7953 Killed  python train.py")
KILLS_ALL_LINES = 200

# an entry's fields (its "time" is left out: the reader need not hand it over)
_TABLE = re.compile(r"^\s*(?P<key>time|host|rank|exitcode|error_file|traceback)\s*:\s?"
                    r"(?P<v>.*)$")
_TABLE_TIME = re.compile(r"(?P<d>\d{4}-\d\d-\d\d)_(?P<h>\d\d):(?P<m>\d\d):(?P<s>\d\d)")
ESCALATION_S = 25  # torchrun sends SIGKILL 30 s after the SIGTERM its survivors ignored
# (a number starts where digits start: from inside a run of digits each start would read
# the rest of the run again)
_TABLE_RANK = re.compile(r"(?<!\d)(?P<rank>\d+) \(local_rank: (?P<local>\d+)\)")
_TABLE_EXIT = re.compile(r"(?<!\d)(?P<code>-?\d+) \(pid: (?P<pid>\d+)\)")
_TABLE_SIGNAL = re.compile(r"Signal (?P<signum>\d+) \((?P<name>SIG\w+)\)")


class LauncherFamily(Family):
    name = NAME
    anchors = (b"exitcode", b"closing signal", b"got signal", b"death signal",
               b"attempts left", b"new nodes from", b"return code", b".py FAILED", b"died with <Signals",
               b"non-zero exit status", b"exited on signal", b"srun: error",
               b"Root Cause", b"Failures:", b"local_rank:", b"ProcessExitedException",
               b"terminated with the following", b"Child process with PID", b"Killed",
               b"host      :", b"error_file", b"traceback :", b"time      :",
               b"Terminating StepId")
    rules = RULES

    def __init__(self):
        self._root = False
        self._table = 0  # which ChildFailedError table an entry is in
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
        if "Terminating StepId" in text:
            self._step_ending = True  # srun tearing the step down: agents get SIGTERM next
            return []
        if (said := self._kills_all) is not None and said[0] == line.file and (
                0 < line.lineno - said[1] <= KILLS_ALL_LINES) and SHELL_KILLED.match(text):
            # the shell's word for the SIGKILL the supervisor just said it sends, not the
            # kernel's OOM killer: the failure is the child's
            return [Signal("supervisor_kill", NAME, TEARDOWN, line, {})]
        out = self._close() + super().feed(line)
        if "orcefully terminating all" in text:
            self._kills_all = (line.file, line.lineno)
        for s in out:
            if s.rule == "task_failed":
                self._step_ending = True
            elif s.rule == "launcher_signaled" and self._step_ending and s.fields.get(
                    "signame", s.fields.get("signum")) in ("15", 15, "SIGTERM"):
                s.role = TEARDOWN  # the scheduler ending a step a task failed in: no cause
        return out

    _step_ending = False
    _kills_all: tuple[str, int] | None = None  # (file, line) where a supervisor said so

    def _section(self, root: bool) -> list[Signal]:
        if not root or not self._root_follows:
            self._table += 1  # "Failures:" opens a table; its "Root Cause" follows in it
        self._root_follows = not root
        self._root = root
        return []

    _root_follows = False

    def _table_field(self, line: LogLine, key: str, v: str) -> list[Signal]:
        out = []
        if ("time_s" if key == "time" else key) in self._entry:  # a new entry begins
            out = self._close()
        e = self._entry
        if self._entry_line is None:
            self._entry_line = line
        if key == "time":
            if m := _TABLE_TIME.search(v):
                e["time_s"] = _seconds(m)
        elif key == "host":
            e["host"] = v
        elif key == "rank" and (m := _TABLE_RANK.search(v)):
            _put_ints(e, rank=m["rank"], local_rank=m["local"])
        elif key == "exitcode" and (m := _TABLE_EXIT.search(v)):
            _put_ints(e, exit_code=m["code"], pid=m["pid"])
        elif key == "traceback":
            if m := _TABLE_SIGNAL.search(v):
                _put_ints(e, signum=m["signum"])
            e["traceback"] = v[:200]
            out += self._close()
        elif key in ("host", "error_file"):
            e[key] = v  # (a rank or exit code in a shape not read: left out, never a string)
        return out

    def _close(self) -> list[Signal]:
        out = self.pending()
        self._entry, self._entry_line = {}, None
        return out

    def pending(self) -> list[Signal]:
        """The entry read so far; a Root Cause entry cut before its exit code still names
        the rank that failed first."""
        e, line = self._entry, self._entry_line
        if line is None or not ("exit_code" in e or self._root and "rank" in e):
            return []
        return [Signal("rank_failed", NAME, EXIT, line, {**e, "root_cause": self._root,
                                                         "table": self._table})]


def _put_ints(entry: dict, **digits: str) -> None:
    """The numbers a table's line gives, into its entry: all of them, or none where one is
    too long to be a number."""
    values = {k: small_int(v) for k, v in digits.items()}
    if None not in values.values():
        entry.update(values)


def _seconds(m: re.Match) -> int:
    """A table's "2024-12-01_08:00:09" as seconds (of the day and the date: only
    differences matter)."""
    y, mo, d = (int(x) for x in m["d"].split("-"))
    days = y * 372 + mo * 31 + d
    return ((days * 24 + int(m["h"])) * 60 + int(m["m"])) * 60 + int(m["s"])


# --- what its problems mean ---------------------------------------------------------------
def workers_stopped(signals: list[Signal]) -> list[Signal]:
    """torchrun's agent sending its workers SIGTERM, in a log that shows no failure, no
    restart and no signal to the agent itself: a worker failed (the agent stops the
    others only then) in lines this log does not hold."""
    if any(s.rule in ("restart", "membership") for s in signals):
        return []  # an elastic restart or a scale event stops workers too
    stopped = [s for s in signals if s.rule == "teardown"]
    if not stopped:
        return []
    pids = sorted({s.fields["pid"] for s in stopped if "pid" in s.fields})
    return [Signal("workers_stopped", NAME, CAUSE, stopped[0].line,
                   {"pids": pids[:64], "stopped": len(pids),
                    "sig": stopped[0].fields.get("sig", "SIGTERM")})]


def describe(p: Problem, ctx) -> Finding:
    """The launcher itself stopped, or stopped its workers after one failed (the CAUSEs of
    this family)."""
    f = p.first.fields
    if p.rule == "workers_stopped":
        n, pids = f["stopped"], f["pids"]
        shown = ", ".join(map(str, pids[:8])) + (", ..." if n > 8 else "")
        return ctx.finding(p, "crash", "error", f"the launcher stopped {n} worker"
                           f"{'s' if n != 1 else ''} ({f['sig']} to pid {shown}): one of its "
                           f"workers failed first, and that worker is not among them; its "
                           f"error is not in this log", [], R.WORKERS_STOPPED)
    sig = f.get("signame") or (signal_name(f["signum"]) if "signum" in f else "a signal")
    if sig.isdigit():  # torch 2.13's agent: "Received 15 death signal"
        sig = signal_name(n) if (n := small_int(sig)) is not None else "a signal"
    return ctx.finding(p, "crash", "error", f"the launcher itself received {sig} and stopped "
                       f"the ranks", [], R.LAUNCHER_SIGNALED)


def collect_exits(signals: list[Signal], teardown_pids: set[int],
                  ranks_by_host: dict | None = None, agents: bool = False,
                  hosts_seen: set | None = None) -> dict[int, dict]:
    """Each failed rank's exit as its launcher reported it, by rank (the earliest report, a
    root-cause entry over others). A launcher that does not say which rank gets a negative
    key. A local rank stands for the rank on one node; under srun with a torchrun per node
    it is looked up in that node's table, else it stays unknown (a negative key)."""
    labels = {(s.line.host, s.line.rank) for s in signals if s.rule == "rank_failed"}
    table_ranks = {((s.line.host, s.line.rank), s.fields["local_rank"]): s.fields["rank"]
                   for s in signals if "rank" in s.fields and "local_rank" in s.fields}
    hosts = {s.fields.get("host") for s in signals if s.fields.get("host")}
    # one node only where the log shows no other (srun "1: [default0]:" lines are node 1's
    # local rank 0: its agent's "local_rank: 0" is not global rank 0)
    one_node = len(hosts | (hosts_seen or set())) <= 1 and len(labels) <= 1
    # srun's "task N" is a node when torchrun (or another launcher) runs under it
    # (`agents`: a launcher's agent printed its own traceback, torchrun's elastic agent)
    per_node = agents or any(s.rule == "rank_failed" for s in signals)
    out: dict[int, dict] = {}
    for i, s in enumerate(signals):
        f = dict(s.fields)
        rank = f.get("rank")
        if rank is None and s.rule == "process_failed":
            rank = -1 - i
        if rank is None and s.rule == "task_failed":
            if per_node:
                continue
            rank = f.get("task")
        if rank is None and "last_spawned" in f and f.get("local_rank") != 0:
            rank = -1 - i  # DeepSpeed printed the last spawned rank's command: which failed?
            f.pop("local_rank", None)
        if rank is None and "local_rank" in f:
            rank = table_ranks.get(((s.line.host, s.line.rank), f["local_rank"]))
            # a node label whose lines show other global ranks: the local rank is not one
            shown = (ranks_by_host or {}).get(s.line.host, ()) if s.line.host else ()
            if rank is None:
                local_is_rank = one_node and (not shown or f["local_rank"] in shown)
                rank = f["local_rank"] if local_is_rank else -1000 - i
        if rank is None:
            continue
        for word, signum in (("killed", 9), ("aborted", 6), ("segv", 11), ("bus", 7),
                             ("term", 15)):
            if f.get(word):
                f["signum"] = signum
        code = f.get("exit_code")
        if code is not None and code < 0:
            f["signum"] = -code
        if f.get("sig") and not f.get("signum") and s.rule == "rank_failed":
            f["signum"] = int(getattr(signal, f["sig"], 0)) or None
        f["rank"], f["order"] = rank, s.order
        # a SIGTERM is the launcher stopping the survivors, except where the log lists the
        # pids it stopped and this one is not among them: then it came from outside
        pid = f.get("pid")
        f["torn_down"] = pid in teardown_pids or f.get("signum") == 15 and not (
            teardown_pids and pid is not None)
        prev = out.get(rank)
        if prev is None or (f.get("root_cause") and not prev.get("root_cause")):
            if prev:
                f["order"] = min(prev["order"], f["order"])
            out[rank] = {**(prev or {}), **f}
        elif "exit_code" not in prev and "exit_code" in f:
            out[rank].update(exit_code=f["exit_code"], signum=f.get("signum"))
        out[rank].setdefault("line", s.line)
    _order_tables(out)
    return out


def _order_tables(exits: dict[int, dict]) -> None:
    """Within one ChildFailedError table the Root Cause entry failed first, though it is
    printed last; a SIGKILL well after it is torchrun's own escalation (the rank ignored
    its SIGTERM), not a failure."""
    tables: dict[int, list[dict]] = {}
    for e in exits.values():
        if e.get("table"):
            tables.setdefault(e["table"], []).append(e)
    for entries in tables.values():
        roots = [e for e in entries if e.get("root_cause")]
        if not roots:
            continue
        first = min(e["order"] for e in entries)
        for e in roots:
            e["order"] = min(e["order"], first) - 0.5
        t0 = min((e["time_s"] for e in roots if "time_s" in e), default=None)
        for e in entries:
            if (t0 is not None and e.get("signum") == 9 and not e.get("root_cause")
                    and e.get("time_s", t0) - t0 >= ESCALATION_S):
                e["torn_down"] = True


def describe_exit(e: dict) -> tuple[str, str, str]:
    """(summary, family, remedy) of an exit nothing else in the log explains."""
    rank = e["rank"]
    host = f" on {e['host']}" if e.get("host") else ""
    who = f"rank {rank}" if rank >= 0 else "a rank (the launcher does not say which)"
    if rank <= -1000 and "local_rank" in e:
        node = e["line"].host or (f"srun task {e['line'].rank}" if e["line"].rank is not None
                                  else "a node")
        who = f"local rank {e['local_rank']} on {node} (its global rank is not in this log)"
    if e.get("signum") == 9:
        return (f"{who}{host} was killed by SIGKILL with no traceback: most likely the host's "
                f"OOM killer", "oom", R.HOST_OOM)
    if e.get("signum") == 7:
        return (f"{who}{host} was killed by SIGBUS: most often /dev/shm is full (DataLoader "
                f"workers, NCCL)", "oom", R.SHM_DATALOADER)
    if e.get("signum") == 15:  # not the launcher's own SIGTERM (collect_exits tells)
        return (f"{who}{host} was killed by SIGTERM first, from outside the job (the launcher "
                f"stopped the others only after it)", NAME, R.SIGTERM_FROM_OUTSIDE)
    return (f"{who}{host} {how_it_ended(e)} first, with no traceback in this log", NAME,
            R.PEER_GONE.replace("A peer process went away mid-collective: the", "The"))


def how_it_ended(e: dict) -> str:
    if e.get("exit_code") is None and not e.get("signum"):
        return "failed (the launcher's report of it is cut off)"
    if e.get("signum") == 6:  # C++ terminate() or abort() in the process itself
        return "exited by abort (SIGABRT)"
    if e.get("signum"):
        return f"was killed by {signal_name(e['signum'])}"
    return f"exited with code {e.get('exit_code')}"
