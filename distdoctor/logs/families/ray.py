"""Ray: a worker process that died under a task or an actor (the raylet's report, the
driver's `ActorDiedError`), one Ray's memory monitor killed, and which rank each Ray worker
was, from what the log tells (Ray Train's worker table, `[rank=N, world_size=M]`, a
`[rankN]:` or "rank N of M" inside a `(RayWorker pid=.., ip=..)` prefix).

Formats: ray 2.x python/ray/exceptions.py (ActorDiedError's "class_name:/pid:/ip:" lines and
"Worker exit type: ... Worker exit detail: ..."), src/ray/raylet/node_manager.cc ("A worker
died or was killed while executing a task by an unexpected system error ... Worker IP
address: .. Worker port: .. Worker PID: ..."), src/ray/common/memory_monitor.cc and
python/ray/_private/utils.py (the memory monitor's "Ray killed this worker ... Memory on the
node (IP: ..) where the task (... pid=N, memory used=..) was running"), ray/train
backend_executor.py ("- (node_id=.., ip=.., pid=N) world_rank=R, local_rank=L, node_rank=K"),
ray/train/torch/config.py ("[rank=R, world_size=W]"). Checked against what ray 2.60.0 printed
here (tests/fixtures/logs/wide/ray_*.log).
"""

from __future__ import annotations

import re

from distdoctor.findings import Finding
from distdoctor.logs.bounds import small_int
from distdoctor.logs.lines import LogLine
from distdoctor.logs.problems import Problem, clip, plural, ranks_text
from distdoctor.logs.signals import CAUSE, CONTEXT, Family, Signal, short_of

NAME = "ray"

# (each field looked for up to the next report's head only: searched to the line's end from
# every head, a line of heads repeated cost its square)
_DIED = r"A worker died or was killed while executing a task by an unexpected system error"
_WORKER_DIED = re.compile(
    _DIED + rf"(?:{short_of(_DIED)}Worker IP address: (?P<ip>\S+))?(?:{short_of(_DIED)}Worker "
    rf"PID: (?P<pid>\d+))?(?:{short_of(_DIED)}Worker exit type: (?P<exit_type>\w+))?"
    rf"(?:{short_of(_DIED)}Worker exit detail: (?P<detail>{short_of(_DIED)})"
    r"(?= Some common causes| There are some potential root causes|$|" + _DIED + "))?")
_ACTOR_DIED = re.compile(r"(?P<exception>(?:ray\.exceptions\.)?(?:ActorDiedError|RayActorError|"
                         r"ActorUnavailableError))(?:\(\w*\))?: (?P<message>The actor died.*|"
                         r"The actor is (?:dead|temporarily unavailable).*)$")
_EXIT_DETAIL = re.compile(r"Worker exit type: (?P<exit_type>\w+)(?: Worker exit detail: "
                          r"(?P<detail>.*?))?(?= There are some potential root causes| Some "
                          r"common causes|$)")
_ACTOR_FIELD = re.compile(r"^\s*(?P<key>class_name|pid|ip|actor_id|name): (?P<v>\S+)")
# (no two runs next to each other take the same characters: linear)
_MEMORY = re.compile(r"Memory on the node \(IP: (?P<ip>[\w.:-]{1,200})"
                     r"(?:[^)\w.:-][^)]{0,400})?\) where the (?:task|actor) \([^)]{0,400}?"
                     r"pid=(?P<pid>\d+)[^)]{0,400}\) was running was (?P<used>[\d.]+[A-Za-z]*) / "
                     r"(?P<total>[\d.]+[A-Za-z]*)")
_TASK_PID = re.compile(r"RayTaskError(?:\((?P<inner>\w+)\))?: " + short_of("RayTaskError")
                       + r"\(pid=(?P<pid>\d+), ip=(?P<ip>[\w.:-]+)")
# which rank a Ray worker is
_TABLE = re.compile(r"pid=(?P<pid>\d+)\) world_rank=(?P<rank>\d+)")
_SAYS_RANK = re.compile(r"\[rank=(?P<rank>\d+), world_size=\d+\]|\brank (?P<r2>\d+) of \d+\b|"
                        r"\bworld_rank[=: ]+(?P<r3>\d+)", re.IGNORECASE)


class RayFamily(Family):
    name = NAME
    orchestrator = True
    # ("pid: ", "ip: ", "class_name: " route an ActorDiedError's field lines here; the reader
    # hands them over after the ActorDiedError line, reader.FOLLOW)
    anchors = (b"A worker died or was killed", b"ActorDiedError", b"RayActorError",
               b"ActorUnavailableError", b"Worker exit type", b"Memory on the node",
               b"RayTaskError", b"world_rank", b"world_size=", b"pid: ", b"ip: ",
               b"class_name: ", b"The actor is dead")

    def __init__(self):
        self._actor: Signal | None = None  # an ActorDiedError still taking its field lines

    def feed(self, line: LogLine) -> list[Signal]:
        text = line.text
        if self._actor is not None:
            if m := _ACTOR_FIELD.match(text):
                self._actor.fields.setdefault(m["key"], m["v"])
                return [Signal("actor_detail", NAME, CONTEXT, line, {})]
            if m := _EXIT_DETAIL.search(text):
                self._actor.fields.update({k: v for k, v in m.groupdict().items() if v})
                self._actor = None
                return [Signal("actor_detail", NAME, CONTEXT, line, {})]
        if m := _WORKER_DIED.search(text):
            return [Signal("worker_died", NAME, CAUSE, line, _ints(m.groupdict()))]
        if m := _ACTOR_DIED.search(text):
            f = {"exception": m["exception"], "message": m["message"][:300]}
            if d := _EXIT_DETAIL.search(text):
                f.update({k: v for k, v in d.groupdict().items() if v})
            self._actor = Signal("actor_died", NAME, CAUSE, line, f)
            return [self._actor]
        if "The actor is dead because" in text and (d := _EXIT_DETAIL.search(text)):
            # the detail alone (a framework logged it with no ActorDiedError line)
            return [Signal("actor_died", NAME, CAUSE, line,
                           {k: v for k, v in d.groupdict().items() if v})]
        if m := _MEMORY.search(text):
            return [Signal("memory_monitor", NAME, CAUSE, line, _ints(m.groupdict()))]
        if (m := _TASK_PID.search(text)) and "pid" in (f := _ints(m.groupdict())):
            return [Signal("ray_task", NAME, CONTEXT, line, f)]
        if (m := _TABLE.search(text)) and {"pid", "rank"} <= (f := _ints(m.groupdict())).keys():
            return [Signal("ray_rank", NAME, CONTEXT, line, f)]
        if line.pid is not None and (m := _SAYS_RANK.search(text)):
            rank = small_int(m["rank"] or m["r2"] or m["r3"])
            if rank is not None:
                return [Signal("ray_rank", NAME, CONTEXT, line, {"pid": line.pid, "rank": rank})]
        return []


def _int(v) -> int | None:
    return v if isinstance(v, int) else small_int(v) if isinstance(v, str) else None


def _ints(d: dict) -> dict:
    """The groups that matched, a pid and a rank as ints (left out when not one)."""
    out = {}
    for k, v in d.items():
        if v and k in ("pid", "rank"):
            v = small_int(v)
            if v is not None:
                out[k] = v
        elif v:
            out[k] = v
    return out


def assign_ranks(signals: list[Signal]) -> None:
    """Ranks for what Ray workers printed and for the workers Ray reports dead, from the
    pid -> rank the log tells; an exception the driver re-raised from a worker's task
    (RayTaskError ... pid=N) is that worker's. Lines that carry a rank keep it. A pid is
    one process only on its own node: pids repeat across nodes, so a worker Ray reports
    dead on one IP is not the rank that printed with its pid on another."""
    ranks: dict[tuple[int, str | None], int] = {}  # (pid, its node's address) -> rank
    for s in signals:
        if s.rule == "ray_rank":
            ranks.setdefault((s.fields["pid"], s.line.host), s.fields["rank"])
        elif s.line.rank is not None and s.line.pid is not None and s.line.local_rank is None:
            ranks.setdefault((s.line.pid, s.line.host), s.line.rank)
    if not ranks:
        return
    task: dict = {}  # who -> the pid of the task whose traceback the driver is printing
    for s in signals:
        line = s.line
        if s.rule == "ray_task":
            task[line.who] = s.fields["pid"]
            continue
        pid = _int(s.fields.get("pid")) if s.family == NAME else None
        host = s.fields.get("ip") if pid is not None else None  # where Ray says it ran
        if pid is None and s.role != CONTEXT and line.who in task:
            pid = task.pop(line.who)  # the error the driver's traceback ends in
            s.fields["ray_pid"] = pid
        if pid is None and line.pid is not None and line.local_rank is None:
            pid, host = line.pid, line.host
        rank = _rank_of(ranks, pid, host)
        if rank is not None and line.rank is None:
            line.rank = rank


def _rank_of(ranks: dict, pid: int | None, host: str | None) -> int | None:
    """The rank of `pid` on `host`; where either side's node is unknown, the one rank
    that pid has."""
    if pid is None:
        return None
    if (pid, host) in ranks:
        return ranks[pid, host]
    known = {r for (p, h), r in ranks.items() if p == pid and (host is None or h is None)}
    return known.pop() if len(known) == 1 else None


# --- what its problems mean ---------------------------------------------------------------
_REMEDY = ("Ray reports the worker process gone, not why: SYSTEM_ERROR with 'connection error' "
           "or 'End of file' is a process killed from outside (the kernel's OOM killer: "
           "`dmesg -T | grep -i oom` on that node) or a crash (SIGSEGV in a native library); "
           "the worker's own log is /tmp/ray/session_latest/logs/worker-*-<pid>.err on that "
           "node. INTENDED_USER_EXIT / USER_ERROR is the program's own exit or exception.")
_MEMORY_REMEDY = ("Ray's memory monitor killed the worker: lower the node's memory use (batch, "
                  "workers per node, object store size), or raise RAY_memory_usage_threshold / "
                  "set RAY_memory_monitor_refresh_ms=0 to hand the choice back to the kernel.")


def describe(p: Problem, ctx) -> Finding:
    f = p.fields()
    ranks = sorted(p.ranks)
    pid, ip = f.get("pid"), f.get("ip")
    where = ", ".join(x for x in (f"pid {pid}" if pid else "", f"on {ip}" if ip else "") if x)
    worker = f"the Ray worker{f' ({where})' if where else ''}"
    rank = (f" (rank{plural(ranks)} {ranks_text(ranks)})" if ranks
            else " (its rank is not in this log)")
    if p.rule == "memory_monitor":
        summary = (f"Ray's memory monitor killed {worker}{rank}: the node's memory was at "
                   f"{f.get('used', '?')} of {f.get('total', '?')}")
        fnd = ctx.finding(p, "crash", "error", summary, ranks, _MEMORY_REMEDY)
        fnd.details["family"] = "oom"
        return fnd
    why = f.get("detail") or f.get("message") or ""
    kind = f" ({f['exit_type']})" if f.get("exit_type") else ""
    actor = f" of actor {f['class_name']}" if f.get("class_name") else ""
    summary = f"{worker}{actor}{rank} died{kind}: {clip(why, 160)}" if why else \
        f"{worker}{actor}{rank} died{kind}"
    fnd = ctx.finding(p, "crash", "error", summary, ranks, _REMEDY)
    fnd.details.update({k: f[k] for k in ("pid", "ip", "exit_type", "detail") if k in f})
    return fnd

