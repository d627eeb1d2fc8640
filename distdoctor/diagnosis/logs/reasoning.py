"""From signals to findings: the first failure is the cause, the rest its consequences, one
finding per problem whatever the number of ranks printing it.

The order of judgement:
1. Causes: exceptions, OOMs, NCCL/store/DDP/mismatch errors, and exits a launcher reports
   with no cause of their own (a SIGKILL with no traceback: the host's OOM killer).
2. Timeouts (ranks that waited): explained by a cause on a rank that did not report the
   timeout; else by the rank behind (its last enqueued work is before the timed-out one);
   else by a rank the log shows still busy (serial work); else by absence, but only where the
   log shows the whole world and the rank's other lines; else the finding says what would
   settle it.
3. Victims (a peer left, the store went away, the launcher's SIGTERMs): consequences of a cause
   or of an exit; alone, they say a peer left without blaming the one who saw it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from distdoctor.diagnosis.findings import Finding
from distdoctor.diagnosis.logs import remedies as R
from distdoctor.diagnosis.logs.families.launcher import signal_name
from distdoctor.diagnosis.logs.signals import (
    BENIGN, CAUSE, CONTEXT, EXIT, TEARDOWN, TIMEOUT, VICTIM, Signal)

MAX_SAMPLE_LINES = 3
_SPECIFIC = ("p2p", "shm", "ib", "socket", "duplicate_gpu")
_GENERIC = ("system_error", "cuda_error", "internal_error", "invalid_usage")
# which specific causes NCCL reports under each generic error code
_EXPLAINS = {"system_error": ("shm", "socket", "ib"), "cuda_error": ("p2p",),
             "internal_error": ("socket", "ib", "p2p"), "invalid_usage": ("duplicate_gpu",)}
_NUM = re.compile(r"0x[0-9a-f]+|\d+")


@dataclass
class Activity:
    """What the log shows of one process (the reader's RankActivity has the same fields)."""

    lines: int = 0
    first_lineno: int = 0
    last_lineno: int = 0
    file: str = ""
    last_text: str = ""


@dataclass
class Problem:
    family: str
    rule: str
    role: str
    key: tuple
    signals: list[Signal] = field(default_factory=list)
    ranks: set[int] = field(default_factory=set)   # ranks that printed it
    hosts: set[str] = field(default_factory=set)
    count: int = 0

    def add(self, s: Signal) -> None:
        self.count += 1
        if len(self.signals) < 64:
            self.signals.append(s)
        r = rank_of(s.line)
        if r is not None:
            self.ranks.add(r)
        if s.line.host:
            self.hosts.add(s.line.host)

    @property
    def first(self) -> Signal:
        return self.signals[0]

    def field(self, name, default=None):
        for s in self.signals:
            if name in s.fields:
                return s.fields[name]
        return default


def rank_of(line) -> int | None:
    """The line's rank; a launcher's local rank stands for it when no node is named (one
    node: torchrun --tee's "[default3]:")."""
    if line.rank is not None:
        return line.rank
    if line.local_rank is not None and line.host is None:
        return line.local_rank
    return None


def problem_key(s: Signal) -> tuple:
    f = s.fields
    if s.rule in ("watchdog_timeout",):
        return s.rule, _pg(s), f.get("seq")
    if s.rule == "exception":
        w = f.get("where") or {}
        return (s.rule, f.get("exception"), _NUM.sub("N", f.get("message", ""))[:120],
                w.get("file"), w.get("line"))
    if s.rule in ("warn", "benign_warn"):
        return s.rule, _NUM.sub("N", f.get("message", ""))[:160]
    if s.rule == "gloo_timeout":  # the sender and the receiver of one wait: one problem
        return s.rule, f.get("timeout_ms")
    if s.rule == "duplicate_gpu":
        return s.rule, f.get("device")
    if s.rule == "port_in_use":
        return s.rule, f.get("port")
    return s.family, s.rule


def _pg(s: Signal) -> str:
    """The process group a c10d message names: its GUID (2.5+), else its number."""
    m = re.search(r"PG GUID ([^\s(\]]+)", s.line.text) or re.search(r"\[PG (?:ID )?(\d+)",
                                                                      s.line.text)
    return m.group(1) if m else "0"


class Evidence:
    """What the log shows beyond the failures: the ranks it holds, the world, progress."""

    def __init__(self, signals: list[Signal], activity: dict, known_ranks: set[int]):
        self.activity = activity
        self.ranks = {w[1] for w in activity if w and w[0] == "rank"} | set(known_ranks)
        # ranks a framework said exist, in lines with no rank prefix ("GLOBAL_RANK: 3")
        self.announced = {s.fields["seen"] for s in signals if s.rule == "rank_seen"}
        self.ranks |= self.announced
        worlds = [s.fields["world"] for s in signals if s.rule == "world"]
        self.world = max(worlds) if worlds else (max(known_ranks) + 1 if known_ranks else None)
        if self.world is not None and self.ranks and max(self.ranks) >= self.world:
            self.world = None  # contradicts the ranks seen: not the job's world
        self.enqueued: dict[tuple[str, int], int] = {}
        for s in signals:
            if "enqueued" in s.fields and s.line.rank is not None:
                self.enqueued[(_pg(s), s.line.rank)] = s.fields["enqueued"]
        self.hosts_of: dict[int, str] = {}
        for s in signals:
            if s.line.rank is not None and s.line.host:
                self.hosts_of.setdefault(s.line.rank, s.line.host)

    def of_rank(self, rank: int) -> Activity | None:
        return self.activity.get(("rank", rank))


class Reasoner:
    def __init__(self, signals: list[Signal], activity: dict, known_ranks: set[int] = frozenset(),
                 progress: dict | None = None):
        self.ev = Evidence(signals, activity, known_ranks)
        self.progress = progress or {}
        self.problems: dict[tuple, Problem] = {}
        self.exits: list[Signal] = []
        self.teardown_pids: set[int] = set()
        self.unused_detail: dict[int, dict] = {}
        for s in signals:
            if s.role == CONTEXT:
                if s.rule == "unused_detail":
                    self.unused_detail.setdefault(s.fields.get("rank", -1), {}).update(s.fields)
                continue
            if s.role == EXIT:
                self.exits.append(s)
                continue
            if s.role == TEARDOWN and "pid" in s.fields:
                self.teardown_pids.add(s.fields["pid"])
            key = problem_key(s)
            p = self.problems.get(key)
            if p is None:
                p = self.problems[key] = Problem(s.family, s.rule, s.role, key)
            p.add(s)

    # --- the whole judgement -----------------------------------------------------------
    def findings(self) -> list[Finding]:
        causes = [p for p in self.problems.values() if p.role == CAUSE]
        causes = self._fold_generic_nccl(causes)
        rdzv = next((p for p in causes if p.rule == "rdzv_connection"), None)
        connect = next((p for p in causes if p.rule in ("connect_timeout", "connect_failed")),
                       None)
        if rdzv and connect:  # the store connection failure is the rendezvous' inner error
            causes.remove(rdzv)
            connect.signals[0].fields.setdefault("exception", "RendezvousConnectionError")
        exits = self._exits()
        out: list[tuple[int, Finding]] = []
        aside: list[tuple[int, Finding]] = []
        cause_ranks: set[int] = set()
        for p in causes:
            f = self._cause_finding(p, exits)
            if self._went_on(p):  # not a cause: reported beside, explaining nothing
                f.severity = "info" if p.rule == "connect_failed" else "warning"
                f.summary += " (the process went on afterwards)"
                f.ranks = sorted(p.ranks) if p.rule == "exception" else []
                aside.append((p.first.order, f))
                continue
            cause_ranks |= set(f.ranks) | p.ranks
            out.append((p.first.order, f))
        same: dict[tuple, tuple[int, Finding]] = {}
        for e in sorted(exits.values(), key=lambda e: e["order"]):  # exits no cause explains
            if e["rank"] in cause_ranks:
                continue
            f = self._exit_finding(e)
            if f is None:
                continue
            cause_ranks.add(e["rank"])
            key = (e.get("signum"), e.get("exit_code"))
            if key in same and f.ranks:  # ranks that died the same way: one finding
                g = same[key][1]
                g.ranks = sorted(set(g.ranks) | set(f.ranks))
                g.summary = re.sub(r"^ranks? [\d, -]+?(?= \D)", f"ranks {_ranks_text(g.ranks)}",
                                   g.summary).replace(" was killed", " were killed")
                continue
            same[key] = (e["order"], f)
            out.append(same[key])
        self._orphans_to_root_cause(out, exits)
        first = min(out, key=lambda t: t[0]) if out else (None, None)
        first_cause = first[1]
        for p in self.problems.values():
            if p.role == TIMEOUT:
                earlier = first[0] is not None and first[0] < p.first.order
                f = self._timeout_finding(p, cause_ranks, first_cause, earlier, exits)
            elif p.role == VICTIM:
                f = self._victim_finding(p, first_cause, exits)
            elif p.role == "warning":
                f = self._cause_finding(p, exits)
                f.severity = "warning"
                f.summary += " (NCCL warned and went on: not necessarily the failure)"
            elif p.role == BENIGN and p.rule == "warn":
                f = self._finding(p, "comm_error", "info",
                                  f"NCCL WARN: {p.field('message', '')}", [],
                                  "Rerun with NCCL_DEBUG=INFO for this warning's context.")
            else:
                continue
            if f is not None:
                out.append((p.first.order, f))
        out += aside
        severity = {"error": 0, "warning": 1, "info": 2}
        out.sort(key=lambda t: (severity[t[1].severity], t[0]))
        return [f for _, f in out]

    # --- causes ------------------------------------------------------------------------
    def _fold_generic_nccl(self, causes: list[Problem]) -> list[Problem]:
        """A generic NCCL error ("unhandled system error") with a specific cause in the log
        (a WARN about /dev/shm, a socket, P2P) is that cause's consequence. A specific WARN
        with no NCCL error at all is a warning: NCCL retried and went on."""
        specific = [p for p in causes if p.rule in _SPECIFIC]
        generic = [p for p in causes if p.rule in _GENERIC]
        if not generic:
            for p in specific:
                if p.rule == "socket" and all("NCCL WARN" in s.line.text for s in p.signals):
                    p.role = "warning"
            return [p for p in causes if p.role == CAUSE]
        if not specific:
            return causes
        kept = []
        for p in causes:
            if p.rule in _GENERIC:
                named = (p.field("cause") or {}).get("rule")
                fits = [q for q in specific if q.rule in _EXPLAINS[p.rule]] or specific
                target = next((q for q in fits if q.rule == named), None) or min(
                    fits, key=lambda q: abs(q.first.order - p.first.order))
                target.ranks |= p.ranks
                target.signals.append(p.first)
                continue
            kept.append(p)
        return kept

    def _cause_finding(self, p: Problem, exits: dict) -> Finding:
        f, r = p.first.fields, p.rule
        ranks = sorted(p.ranks)
        on = _on(ranks)
        if r in ("exception", "usage_error"):
            return self._exception_finding(p, exits)
        if r == "cuda_oom":
            gpu = f" on GPU {f['gpu']}" if "gpu" in f else ""
            ask = f": tried to allocate {f['requested']}" if "requested" in f else ""
            free = f" with {f['free']} free of {f['total']}" if "free" in f else ""
            return self._finding(p, "crash", "error",
                                 f"CUDA out of memory{on}{gpu}{ask}{free}", ranks, R.CUDA_OOM)
        if r == "shm_bus_error":
            return self._finding(p, "crash", "error",
                                 f"a DataLoader worker hit a bus error: /dev/shm is too small{on}",
                                 ranks, R.SHM_DATALOADER)
        if r in ("host_oom", "dataloader_killed", "host_alloc_failed"):
            what = {"host_oom": "the host's OOM killer killed a process",
                    "dataloader_killed": "a DataLoader worker was killed (SIGKILL): host out "
                                         "of memory",
                    "host_alloc_failed": "host memory exhausted (CPU allocation failed)"}[r]
            return self._finding(p, "crash", "error", f"{what}{on}", ranks, R.HOST_OOM)
        if r == "port_in_use":
            port = f.get("port", "?")
            # only the store's server listens: with no launcher in the log (env://), rank 0
            if not ranks and not self.exits and not p.field("in_launcher") and not any(
                    q.family == "launcher" for q in self.problems.values()):
                ranks, on = [0], " on rank 0, which hosts the store under env://"
            return self._finding(p, "comm_error", "error",
                                 f"c10d store port {port} is already in use (EADDRINUSE){on}",
                                 ranks, R.PORT_IN_USE)
        if r in ("connect_timeout", "connect_failed", "rdzv_connection"):
            where = f" at {f['host']}:{f['port']}" if "host" in f else ""
            after = f" (timed out after {f['after']})" if "after" in f else ""
            # under env:// rank 0 hosts the store: clients that are all other ranks say it
            # was not listening
            host = [0] if ranks and 0 not in ranks and r != "rdzv_connection" \
                and not self._went_on(p) else []
            who = "; rank 0, which hosts the store, was not listening" if host else ""
            return self._finding(p, "comm_error", "error",
                                 f"{_exc(p)}could not reach the c10d store{where}{after}{on}"
                                 f"{who}", host, R.STORE_CONNECT)
        if r == "detail_mismatch":
            return self._detail_finding(p)
        if r == "monitored_barrier":
            missing = sorted({x for s in p.signals for x in s.fields.get("missing", [])})
            return self._finding(p, "hang", "error",
                                 f"rank{_s(missing)} {_ranks_text(missing)} failed to pass "
                                 f"monitoredBarrier (reported by rank{_s(ranks)} "
                                 f"{_ranks_text(ranks)})", missing, R.MONITORED_BARRIER)
        if r == "unused_parameters":
            return self._unused_finding(p)
        if r == "model_mismatch":
            return self._finding(p, "mismatch", "error",
                                 f"DDP model differs across ranks{on}: "
                                 f"{_clip(p.first.line.text, 160)}", ranks,
                                 R.DDP_MODEL_MISMATCH)
        if r == "launcher_signaled":
            sig = f.get("signame") or (signal_name(f["signum"]) if "signum" in f else "a signal")
            return self._finding(p, "crash", "error",
                                 f"the launcher itself received {sig} and stopped the ranks",
                                 [], R.LAUNCHER_SIGNALED)
        nccl = {
            "duplicate_gpu": (f"ranks {f.get('a')} and {f.get('b')} share CUDA device "
                              f"{f.get('device')} (Duplicate GPU detected)", R.NCCL_USAGE),
            "p2p": ("GPU peer-to-peer access failed (CUDA error 217 'peer access is not "
                    f"supported between these two devices'){on}", R.P2P),
            "shm": (f"NCCL could not create its shared memory segment in /dev/shm{on}", R.SHM),
            "ib": (f"InfiniBand transport error{on}: {_clip(_after_warn(p), 140)}", R.IB),
            "socket": (f"NCCL socket/bootstrap failure{on}: {_clip(_after_warn(p), 140)}",
                       R.SOCKET),
            "system_error": (f"NCCL unhandled system error{on}{_cause_text(p)}", R.NCCL_SYSTEM),
            "cuda_error": (f"CUDA error in NCCL{on}{_cause_text(p)}", R.NCCL_CUDA),
            "invalid_usage": (f"NCCL invalid usage{on}{_cause_text(p)}", R.NCCL_USAGE),
            "internal_error": (f"NCCL internal error{on}{_cause_text(p)}", R.NCCL_INTERNAL),
            "gloo_connect": (f"Gloo could not connect to a peer{on}", R.SOCKET),
        }
        summary, remedy = nccl.get(r, (f"{r.replace('_', ' ')}{on}", None))
        culprits = sorted({f.get("a"), f.get("b")} - {None}) if r == "duplicate_gpu" else ranks
        return self._finding(p, "comm_error", "error", summary, culprits, remedy)

    def _went_on(self, p: Problem) -> bool:
        """A cause its process lived well past: a retried connection (torch prints one while
        rank 0's store is not up yet), an exception a framework caught and logged."""
        if p.rule == "connect_failed":
            return all(s.line.level in ("W", "WARNING", "I", "INFO") for s in p.signals)
        if p.rule != "exception" or not p.ranks:
            return False
        for r in p.ranks:
            a = self.ev.of_rank(r)
            if a is None or a.file != p.first.line.file or \
                    a.last_lineno <= p.first.line.lineno + 20:
                return False
        return not any(q.role in (TIMEOUT, VICTIM) for q in self.problems.values()) and \
            not self.exits

    def _exception_finding(self, p: Problem, exits: dict) -> Finding:
        f = dict(p.first.fields)
        if p.rule == "usage_error":
            f["exception"] = f"{f.get('prog', 'the script')}: error"
        ranks = sorted(p.ranks)
        where = f.get("where") or {}
        at = (f" at {_short(where['file'])}:{where['line']} in {where['function']}"
              if where.get("file") else "")
        msg = f": {_clip(f['message'], 160)}" if f.get("message") else ""
        world = self.ev.ranks
        every = len(ranks) >= 2 and world and set(ranks) >= world
        if not ranks and p.count >= 2 and len(exits) == p.count:
            # the same traceback once per process, unlabelled: one per rank the launcher had
            ranks, every = sorted(exits), True
        if p.rule == "usage_error" and not every:  # a launcher's exits say who else failed
            failed = {e["rank"] for e in exits.values()
                      if e.get("exit_code") == 2 and not e.get("torn_down")}
            every = len(failed) >= 2 and failed >= set(ranks)
            ranks = sorted(failed | set(ranks)) if every else ranks
        if every:
            early = not any(q.role == TIMEOUT or q.family in ("nccl", "gloo")
                            for q in self.problems.values()
                            if q.first.order < p.first.order and q.role != BENIGN)
            lead = (f"every rank ({_ranks_text(ranks)}) failed at start-up with "
                    if early else f"every rank ({_ranks_text(ranks)}) raised ")
            summary = f"{lead}{f['exception']}{msg}{at}"
            family = "startup" if early else "exception"
            fnd = self._finding(p, "crash", "error", summary, ranks,
                                R.STARTUP if early else R.EXCEPTION)
            fnd.details["family"] = family
            return fnd
        how = ""
        codes = [exits[r] for r in ranks if r in exits]
        if codes:
            how = f" and {_how(codes[0])}"
        elif ranks:
            how = " (it had not exited when the log ends: the others wait for it)" \
                if self._alive_after(ranks[0], p.first) else ""
        summary = f"rank{_s(ranks)} {_ranks_text(ranks)} raised {f['exception']}{msg}{at}{how}" \
            if ranks else f"{f['exception']}{msg}{at}"
        fnd = self._finding(p, "crash", "error", summary, ranks, R.EXCEPTION)
        if where.get("file"):
            fnd.callsites = [{"rank": r, **where} for r in ranks[:8]]
        return fnd

    def _detail_finding(self, p: Problem) -> Finding:
        ops: dict[int, str] = {}
        seq = None
        for s in p.signals:
            f = s.fields
            ops[f["rank"]] = _op_text(f.get("mine", {}))
            if "other" in f:
                ops.setdefault(f["other"], _op_text(f.get("theirs", {})))
            seq = seq or f.get("mine", {}).get("seq")
        by_op: dict[str, list[int]] = {}
        for r, op in sorted(ops.items()):
            by_op.setdefault(op, []).append(r)
        groups = sorted(by_op.items(), key=lambda kv: len(kv[1]))
        culprits = groups[0][1] if len(groups) > 1 and len(groups[0][1]) < len(groups[-1][1]) \
            else sorted(ops)
        text = "; ".join(f"rank{_s(rs)} {_ranks_text(rs)}: {op}" for op, rs in by_op.items())
        fnd = self._finding(p, "mismatch", "error",
                            f"collective mismatch (TORCH_DISTRIBUTED_DEBUG=DETAIL) at sequence "
                            f"number {seq}: {text}", culprits, R.MISMATCH)
        fnd.seq = seq
        fnd.details["ops"] = {str(r): op for r, op in ops.items()}
        return fnd

    def _unused_finding(self, p: Problem) -> Finding:
        ranks = sorted(p.ranks)
        detail: dict = {}
        for s in p.signals:
            for k in ("indices", "names"):
                if k in s.fields:
                    detail.setdefault(k, s.fields[k])
        for r in ranks:
            for k, v in self.unused_detail.get(r, {}).items():
                if k in ("indices", "names"):
                    detail.setdefault(k, v)
        which = ""
        if detail.get("names"):
            which = f": {_clip(detail['names'], 160)}"
        elif detail.get("indices"):
            which = f": parameter indices {' '.join(map(str, detail['indices'][:20]))}"
        fnd = self._finding(p, "crash", "error",
                            f"DDP: parameters did not receive gradients{_on(ranks)} (Expected "
                            f"to have finished reduction in the prior iteration){which}; "
                            f"find_unused_parameters=True or use every parameter",
                            ranks, R.DDP_UNUSED)
        fnd.details.update(detail)
        return fnd

    # --- exits -------------------------------------------------------------------------
    def _exits(self) -> dict[int, dict]:
        """Each failed rank's exit, as its launcher reported it; the earliest per rank."""
        hosts = {s.fields.get("host") for s in self.exits if s.fields.get("host")}
        out: dict[int, dict] = {}
        for i, s in enumerate(self.exits):
            f = dict(s.fields)
            rank = f.get("rank")
            if rank is None and s.rule == "process_failed":
                rank = -1 - i  # the launcher did not say which rank
            if rank is None and s.rule == "task_failed":
                rank = f.get("task")
            if rank is None and len(hosts) <= 1:
                rank = f.get("local_rank")  # one node: local rank is the rank
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
            f["torn_down"] = f.get("pid") in self.teardown_pids or f.get("signum") == 15
            prev = out.get(rank)
            if prev is None or (f.get("root_cause") and not prev.get("root_cause")):
                if prev:
                    f["order"] = min(prev["order"], f["order"])
                out[rank] = {**(prev or {}), **f}
            f["line"] = s.line
            out[rank].setdefault("line", s.line)
        return out

    def _exit_finding(self, e: dict) -> Finding | None:
        rank = e["rank"]
        if e.get("torn_down"):
            return None
        # a rank that timed out (or lost a peer) exits because of it: not a cause
        for p in self.problems.values():
            if p.role in (TIMEOUT, VICTIM, TEARDOWN) and rank in p.ranks:
                return None
            if p.role == TIMEOUT and e.get("signum") == 6:
                return None  # NCCL's watchdog aborts the process after a timeout
            if p.role == TIMEOUT and not e.get("signum") and self.ev.of_rank(rank) is None:
                return None  # its output is not in this log: it may have timed out too
        host = f" on {e['host']}" if e.get("host") else ""
        who = f"rank {rank}" if rank >= 0 else "a rank (the launcher does not say which)"
        if e.get("signum") == 9:
            summary = (f"{who}{host} was killed by SIGKILL with no traceback: most "
                       f"likely the host's OOM killer")
            fam, remedy = "oom", R.HOST_OOM
        elif e.get("signum") == 7:
            summary = (f"{who}{host} was killed by SIGBUS: most often /dev/shm is full "
                       f"(DataLoader workers, NCCL)")
            fam, remedy = "oom", R.SHM_DATALOADER
        else:
            summary = f"{who}{host} {_how(e)} first, with no traceback in this log"
            fam, remedy = "launcher", R.PEER_GONE.replace(
                "A peer process went away mid-collective: the", "The")
        details = {"signature": f"log/{fam}/exit/{rank}", "source": "log", "family": fam,
                   "rule": "rank_exit", "exit": {k: v for k, v in e.items()
                                                 if isinstance(v, (int, str, bool))},
                   "lines": [e["line"].text[:300]] if e.get("line") else []}
        return Finding("crash", "error", summary, ranks=[rank] if rank >= 0 else [],
                       details=details, remedy=remedy)

    # --- timeouts ----------------------------------------------------------------------
    def _timeout_finding(self, p: Problem, cause_ranks: set[int],
                         first_cause: Finding | None, earlier: bool, exits: dict) -> Finding:
        reporters = sorted(p.ranks)
        what = self._timeout_text(p)
        reported = f" on rank{_s(reporters)} {_ranks_text(reporters)}" if reporters else ""
        explained = sorted(cause_ranks - set(reporters))
        if first_cause is not None and (explained or not cause_ranks or earlier):
            self._add_consequence(first_cause, p, f"{what}{reported}")
            return None
        if p.rule == "heartbeat_timeout":  # the reporter's own watchdog is stuck
            return self._finding(p, "hang", "error",
                                 f"{what}{reported}: a CUDA or NCCL call hung on "
                                 f"{'that rank' if len(reporters) == 1 else 'those ranks'}",
                                 reporters, R.WATCHDOG_STUCK)
        owners = self._key_owners(p) or self._not_joined(p)
        if owners:
            return self._finding(p, p_kind(p), "error",
                                 f"{what}{reported}; rank{_s(owners)} {_ranks_text(owners)} "
                                 f"never {'wrote it' if p.rule == 'key_timeout' else 'joined'}",
                                 owners, self._timeout_remedy(p))
        behind = self._behind(p)
        if behind:
            return self._finding(p, p_kind(p), "error",
                                 f"{what}{reported}; rank{_s(behind)} {_ranks_text(behind)} "
                                 f"never enqueued it (last enqueued work "
                                 f"{self.ev.enqueued[(_pg(p.first), behind[0])]})",
                                 behind, self._timeout_remedy(p))
        busy = self._busy(p, reporters)
        if busy:
            rank, last = busy
            fnd = self._finding(p, "hang", "error",
                                f"rank {rank} never reached the collective the others timed "
                                f"out on ({what}{reported}): it was still busy with serial "
                                f"work; its last output: {_clip(last, 120)!r}", [rank],
                                R.SERIAL_WORK)
            fnd.details["family"] = "serial_work"
            fnd.details["last_output"] = last
            return fnd
        stopped = self._stopped_silent(p, exits)
        if stopped:
            return self._finding(p, p_kind(p), "error",
                                 f"{what}{reported}; rank{_s(stopped)} {_ranks_text(stopped)} "
                                 f"never reported it and {'was' if len(stopped) == 1 else 'were'}"
                                 f" still running when the launcher stopped the job (SIGTERM): "
                                 f"never arrived", stopped, self._timeout_remedy(p))
        absent = self._absent(reporters)
        if absent:
            return self._finding(p, p_kind(p), "error",
                                 f"{what}{reported}; rank{_s(absent)} {_ranks_text(absent)} "
                                 f"never reported it: likely never arrived", absent,
                                 self._timeout_remedy(p))
        fnd = self._finding(p, p_kind(p), "error",
                            f"{what}{reported}; which rank never arrived is not in this log",
                            [], R.SETTLE_ABSENCE if p.family in ("nccl", "gloo")
                            else self._timeout_remedy(p))
        return fnd

    def _timeout_text(self, p: Problem) -> str:
        f = {}
        for s in p.signals:
            for k, v in s.fields.items():
                f.setdefault(k, v)
        if p.rule == "watchdog_timeout":
            op = f" in {f['op']}" if "op" in f else ""
            after = f" after {_secs(f['timeout_ms'])}" if "timeout_ms" in f else ""
            return f"NCCL watchdog timeout{op} (SeqNum {f.get('seq')}){after}"
        if p.rule == "heartbeat_timeout":
            return "the NCCL watchdog/heartbeat monitor timed out"
        if p.rule == "gloo_timeout":
            ops = sorted({s.fields["op"] for s in p.signals if "op" in s.fields})
            return (f"Gloo timed out after {_secs(f.get('timeout_ms', 0))} waiting for a "
                    f"{'/'.join(ops) or '?'}")
        if p.rule == "join_timeout":
            return (f"{_exc(p)}rendezvous incomplete: {f.get('joined')}/{f.get('world')} clients "
                    f"joined the c10d store in {f.get('secs')} s")
        if p.rule == "rdzv_timeout":
            return f"{_exc(p)}the rendezvous timed out: not every node joined"
        if p.rule == "barrier_timeout":
            return (f"the store-based barrier of init_process_group/new_group timed out: "
                    f"{f.get('joined')} of {f.get('world')} ranks arrived (key {f.get('keys')})")
        if p.rule == "unique_id_timeout":
            return (f"ranks waited for rank {f.get('owner')}'s NCCL unique id in the c10d store "
                    f"({_clip(f.get('error', ''), 60)})")
        if p.rule == "key_timeout":
            keys = f" for key {f['keys']}" if f.get("keys") else ""
            return f"{_exc(p)}c10d store wait timeout{keys}: a rank never wrote it"
        return p.rule.replace("_", " ")

    def _timeout_remedy(self, p: Problem) -> str:
        return {"gloo_timeout": R.GLOO_TIMEOUT, "join_timeout": R.STORE_JOIN,
                "barrier_timeout": R.STORE_JOIN, "unique_id_timeout": R.STORE_KEY,
                "rdzv_timeout": R.RDZV_TIMEOUT, "key_timeout": R.STORE_KEY,
                "heartbeat_timeout": R.WATCHDOG_STUCK}.get(p.rule, R.FIND_LATE_RANK)

    def _key_owners(self, p: Problem) -> list[int]:
        """A store key that names its writer: c10d's group keys end in the rank
        (".../cpu//0/3"), users' keys often say "rank1/..."; NCCL's unique id is rank 0's."""
        if p.rule == "unique_id_timeout":
            owner = p.field("owner")
            return [owner] if owner is not None and owner not in p.ranks else []
        if p.rule != "key_timeout" or not p.field("keys"):
            return []
        key = str(p.field("keys")).strip("[]'\" ")
        m = re.search(r"rank[_-]?(\d+)", key, re.I) or re.search(r"/(\d+)$", key)
        if not m:
            return []
        rank = int(m.group(1))
        limit = self.ev.world or (max(self.ev.ranks) + 2 if self.ev.ranks else 2)
        return [rank] if rank < limit and rank not in p.ranks else []

    def _not_joined(self, p: Problem) -> list[int]:
        """Only the store's own client joined (1/N): ranks 1..N-1 never came."""
        if p.rule != "join_timeout" or p.field("joined") != 1:
            return []
        where = str((p.field("where") or {}).get("file", ""))
        if "torchrun" in where or "elastic" in where or "distributed/run" in where:
            return []  # torchrun's agents are the store's clients: nodes, not ranks
        world = p.field("world") or 0
        return list(range(1, world)) if 1 < world <= 16 else []

    def _behind(self, p: Problem) -> list[int]:
        seq = p.field("seq")
        if seq is None:
            return []
        pg = _pg(p.first)
        enq = {r: n for (g, r), n in self.ev.enqueued.items() if g == pg}
        return sorted(r for r, n in enq.items() if n < seq and r not in p.ranks)

    def _busy(self, p: Problem, reporters: list[int]) -> tuple[int, str] | None:
        """A rank that kept printing after the others timed out and never reported it."""
        last_report = max(s.line.lineno for s in p.signals)
        files = {s.line.file for s in p.signals}
        busy = []
        for rank in sorted(self.ev.ranks - set(reporters)):
            a = self.ev.of_rank(rank)
            if a is None or a.file not in files or a.last_lineno <= p.first.line.lineno:
                continue
            if a.last_text and not _is_teardown(a.last_text):
                busy.append((a.last_lineno - last_report, rank, a.last_text))
        if len(busy) == 1 or (busy and not self._world_complete(reporters)):
            _, rank, text = max(busy)
            return rank, text
        # progress printed with no rank prefix that moved on after the others timed out:
        # the one rank not waiting printed it (a world of N with N-1 reporters; or ranks
        # 1.. waiting for rank 0, as in main_process_first)
        moved = self._moved_after(self.progress.get(None, ()), p.first.line, files)
        if moved is None:
            return None
        missing = (set(range(self.ev.world)) - set(reporters)) if self.ev.world else (
            {0} if reporters and 0 not in reporters and reporters == list(
                range(1, max(reporters) + 1)) else set())
        if len(missing) == 1:
            return missing.pop(), moved.text[:300]
        return None

    @staticmethod
    def _moved_after(lines, first, files):
        before = {ln.text for ln in lines if ln.lineno <= first.lineno}
        after = [ln for ln in lines if ln.lineno > first.lineno and ln.file in files
                 and ln.text not in before]
        return after[-1] if after else None

    def _orphans_to_root_cause(self, out: list, exits: dict) -> None:
        """A cause printed with no rank (an unprefixed traceback) belongs to the one rank the
        launcher reports as failed first with no cause of its own."""
        ranked = {r for _, f in out for r in f.ranks if f.details.get("rule") != "rank_exit"}
        failed = [e for e in exits.values() if e.get("root_cause") and e["rank"] not in ranked
                  and not e.get("torn_down")]
        orphans = [f for _, f in out if not f.ranks and f.kind == "crash"
                   and f.details.get("rule") != "launcher_signaled"]
        if len(failed) == 1 and len(orphans) == 1:
            rank = failed[0]["rank"]
            f = orphans[0]
            f.ranks = [rank]
            f.summary = f"rank {rank}: {f.summary}"
            out[:] = [(o, g) for o, g in out if not (g.details.get("rule") == "rank_exit"
                                                     and g.ranks == [rank])]

    def _stopped_silent(self, p: Problem, exits: dict) -> list[int]:
        """Ranks the launcher had to stop (SIGTERM) that never reported the timeout: alive,
        and not in the collective. Only when every other rank that failed reported it (a
        failed rank whose output is not here could be the culprit as well)."""
        silent = [r for r, e in exits.items() if r >= 0 and r not in p.ranks]
        stopped = sorted(r for r in silent if exits[r].get("torn_down"))
        if not p.ranks or len(stopped) != len(silent):
            return []
        # the log must show the others' output (torchrun --local-ranks-filter hides ranks)
        shown = all(self.ev.of_rank(r) is not None for r in exits if r >= 0 and r not in stopped)
        return stopped if shown and len(stopped) <= len(p.ranks) else []

    def _world_complete(self, reporters: list[int]) -> bool:
        return self.ev.world is not None and len(reporters) >= self.ev.world - 1

    def _absent(self, reporters: list[int]) -> list[int]:
        """Ranks named from absence: only where the world is known and the log holds their
        other lines (it is complete for them)."""
        if self.ev.world is None or not reporters:
            return []
        missing = sorted(set(range(self.ev.world)) - set(reporters))
        if missing and all(self.ev.of_rank(r) is not None or r in self.ev.announced
                           for r in missing) and \
                len(missing) < self.ev.world / 2 + 1:
            return missing
        return []

    def _alive_after(self, rank: int, s: Signal) -> bool:
        a = self.ev.of_rank(rank)
        return a is not None and a.file == s.line.file and a.last_lineno > s.line.lineno + 50

    # --- victims -----------------------------------------------------------------------
    def _victim_finding(self, p: Problem, first_cause: Finding | None,
                        exits: dict) -> Finding | None:
        reporters = sorted(p.ranks)
        what = {"gloo_peer_gone": "Gloo lost a peer mid-collective (connection closed)",
                "remote_error": "NCCL remote error: a peer exited or the network failed",
                "store_gone": "lost the connection to the c10d store",
                "rdzv_closed": "the rendezvous was closed",
                "monitored_barrier_peer": "ranks waiting in monitored_barrier got errors"}.get(
            p.rule, p.rule)
        seen = f" (seen by rank{_s(reporters)} {_ranks_text(reporters)})" if reporters else ""
        if first_cause is not None:
            self._add_consequence(first_cause, p, f"{what}{seen}")
            return None
        left = self._left(p, exits)
        if left is not None:
            rank, last = left
            return self._finding(p, "comm_error", "error",
                                 f"rank {rank} left the job while the others were in a "
                                 f"collective (it exited without an error; its last output: "
                                 f"{_clip(last, 100)!r}); {what}{seen}", [rank], R.PEER_LEFT)
        return self._finding(p, "comm_error", "error",
                             f"{what}{seen}; the rank that left is not in this log",
                             [], R.PEER_GONE)

    def _left(self, p: Problem, exits: dict) -> tuple[int, str] | None:
        """The one known rank that neither lost the peer nor failed: the one that left."""
        known = self.ev.ranks | {r for r in exits if r >= 0} | p.ranks
        # ranks are 0..N-1: a gap in the ones seen is a rank too
        known |= set(range(self.ev.world or (max(known) + 1 if known else 0)))
        # not a rank that failed; first a rank the launcher does not list (it exited 0), else
        # the one it stopped (SIGTERM) while that rank was still on its way out
        failed = {r for r, e in exits.items() if not e.get("torn_down")}
        others = known - p.ranks - failed
        unlisted = sorted(others - set(exits))
        pick = unlisted if unlisted else sorted(others)
        if len(pick) != 1 or len(p.ranks) < 1:
            return None
        a = self.ev.of_rank(pick[0])
        return pick[0], (a.last_text if a else "")

    def _add_consequence(self, cause: Finding, p: Problem, text: str) -> None:
        cons = cause.details.setdefault("consequences", [])
        if len(cons) < 20:
            cons.append({"rule": p.rule, "summary": text, "reporting_ranks": sorted(p.ranks),
                         "count": p.count})
        if p.role == TIMEOUT and "then" not in cause.summary:
            cause.summary += f"; then {text}"

    # --- building findings -------------------------------------------------------------
    def _finding(self, p: Problem, kind: str, severity: str, summary: str, ranks: list[int],
                 remedy: str | None) -> Finding:
        hosts = sorted(p.hosts | {self.ev.hosts_of[r] for r in ranks if r in self.ev.hosts_of})
        details = {"signature": "log/" + "/".join(map(str, p.key)), "source": "log",
                   "family": p.family, "rule": p.rule, "reporting_ranks": sorted(p.ranks),
                   "count": p.count, "lines": _samples(p)}
        if hosts:
            details["hosts"] = hosts[:16]
        for k in ("seq", "op", "numel_in", "numel_out", "timeout_ms", "ran_ms", "port",
                  "requested", "free", "total", "gpu", "exception", "message", "keys",
                  "joined", "world", "cause"):
            v = p.field(k)
            if v is not None:
                details[k] = v
        m = re.search(r"PG GUID ([^\s(\]]+)(?:\(([^)]*)\))?", p.first.line.text)
        group = m.group(1) if m else None
        if m and m.group(2):
            details["group_desc"] = m.group(2)
        seq = p.field("seq") if isinstance(p.field("seq"), int) else None
        return Finding(kind, severity, summary, ranks=list(ranks), group=group, seq=seq,
                       details=details, remedy=remedy)


def p_kind(p: Problem) -> str:
    """A collective or a store key that timed out is a hang (a rank never arrived); a
    rendezvous that did is a failure to start."""
    return "comm_error" if p.rule in ("join_timeout", "rdzv_timeout",
                                      "barrier_timeout") else "hang"


def _exc(p: Problem) -> str:
    """"RendezvousTimeoutError: " when a traceback named the exception."""
    e = p.field("exception")
    return f"{e.rsplit('.', 1)[-1]}: " if e and e.rsplit(".", 1)[-1] not in (
        "RuntimeError", "Exception", "ValueError") else ""


def _samples(p: Problem) -> list[str]:
    out = []
    for s in p.signals:
        t = s.line.text.strip()[:300]
        if t not in out:
            out.append(t)
        if len(out) >= MAX_SAMPLE_LINES:
            break
    return out


def _cause_text(p: Problem) -> str:
    c = p.field("cause")
    if not c:
        return ""
    return f": {_clip(c.get('line', ''), 140)}"


def _after_warn(p: Problem) -> str:
    t = p.first.line.text
    i = t.find("NCCL WARN")
    return t[i + 9:].strip() if i >= 0 else t.strip()


def _how(e: dict) -> str:
    if e.get("signum") == 6:  # C++ terminate() or abort() in the process itself
        return "exited by abort (SIGABRT)"
    if e.get("signum"):
        return f"was killed by {signal_name(e['signum'])}"
    return f"exited with code {e.get('exit_code')}"


def _op_text(fp: dict) -> str:
    op = fp.get("op", "?")
    return f"{op} of shape {fp['shape']}" if fp.get("shape") else op


def _is_teardown(text: str) -> bool:
    return bool(re.search(r"SIGTERM|SignalException|Traceback|Error|Killed|exitcode", text))


def _on(ranks) -> str:
    return f" on rank{_s(ranks)} {_ranks_text(ranks)}" if ranks else ""


def _s(ranks) -> str:
    return "s" if len(ranks) > 1 else ""


def _ranks_text(ranks) -> str:
    """"0, 2, 5" or ranges "0-3, 7" when long."""
    ranks = sorted(set(ranks))
    if len(ranks) <= 6:
        return ", ".join(map(str, ranks))
    parts, start, prev = [], ranks[0], ranks[0]
    for r in ranks[1:] + [None]:
        if r is not None and r == prev + 1:
            prev = r
            continue
        parts.append(f"{start}-{prev}" if prev > start else str(start))
        if r is not None:
            start = prev = r
    return ", ".join(parts)


def _secs(ms: int) -> str:
    s = int(ms) / 1000
    return f"{s:.0f} s" if s >= 10 else f"{s:g} s"


def _short(path: str) -> str:
    parts = path.split("/")
    return "/".join(parts[-2:]) if len(parts) > 2 else path


def _clip(text: str, n: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[:n - 1] + "…"
