"""Problems (the signals of one failure, from however many ranks), what the log shows beyond
them (`Evidence`), and the words findings are made of. Shared by the reasoning and by the
families, which say what their own problems mean."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from distdoctor.findings import Finding
from distdoctor.logs.bounds import MAX_RANKS
from distdoctor.logs.lines import RankActivity
from distdoctor.logs.signals import Signal

MAX_SAMPLE_LINES = 3
MAX_SIGNALS_KEPT = 64  # per problem: enough to read it, bounded whatever the ranks
_NUM = re.compile(r"0x[0-9a-f]+|\d+")
_PG_GUID = re.compile(r"PG GUID ([^\s(\]]+)(?:\(([^)]*)\))?")
_PG_NUM = re.compile(r"\[PG (?:ID )?(\d+)")


@dataclass
class Problem:
    """One failure as the log shows it: its signals and the ranks that printed them."""

    family: str
    rule: str
    role: str
    key: tuple
    signals: list[Signal] = field(default_factory=list)
    ranks: set[int] = field(default_factory=set)
    hosts: set[str] = field(default_factory=set)
    count: int = 0

    def add(self, s: Signal) -> None:
        self.count += 1
        if len(self.signals) < MAX_SIGNALS_KEPT:
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
        """The first value any of its signals has for `name`."""
        for s in self.signals:
            if name in s.fields:
                return s.fields[name]
        return default

    def fields(self) -> dict:
        out: dict = {}
        for s in self.signals:
            for k, v in s.fields.items():
                out.setdefault(k, v)
        return out


def rank_of(line) -> int | None:
    """The line's rank; a launcher's local rank stands for it when no node is named (one
    node: torchrun --tee's "[default3]:")."""
    if line.rank is not None:
        return line.rank
    if line.local_rank is not None and line.host is None:
        return line.local_rank
    return None


def problem_key(s: Signal) -> tuple:
    """What makes two lines one problem (on different ranks, or printed twice)."""
    f = s.fields
    if s.rule == "watchdog_timeout":
        # by sequence number alone: one rank's "[Rank 0] Watchdog caught ..." names no group
        # while its "[PG 1 Rank 0] Exception ... at work: N" does, and both are one problem
        return s.rule, f.get("seq")
    if s.rule == "exception":
        w = f.get("where") or {}
        return (s.rule, f.get("exception"), _NUM.sub("N", f.get("message", ""))[:120],
                w.get("file"), w.get("line"))
    if s.rule in ("warn", "benign_warn"):
        return s.rule, _NUM.sub("N", f.get("message", ""))[:160]
    if s.rule == "gloo_timeout":  # the sender and the receiver of one wait: one problem
        return s.rule, f.get("timeout_ms")
    if s.rule == "cuda_error":  # one CUDA error, however many ranks and lines print it
        return s.rule, f.get("cuda")
    if s.rule == "duplicate_gpu":
        return s.rule, f.get("device")
    if s.rule == "port_in_use":  # its retries, the give-up and the traceback: one problem
        return (s.rule,)
    return s.family, s.rule


def pg_of(s: Signal) -> str:
    """The process group a c10d message names: its GUID (2.5+), else its number."""
    m = _PG_GUID.search(s.line.text) or _PG_NUM.search(s.line.text)
    return m.group(1) if m else "0"


class Evidence:
    """What the log shows beyond the failures: the ranks it holds, the world, progress."""

    def __init__(self, signals: list[Signal], activity: dict, known_ranks: set[int]):
        self.activity = activity
        self.ranks = {w[1] for w in activity if w and w[0] == "rank"} | set(known_ranks)
        # ranks a framework said exist, in lines with no rank prefix ("GLOBAL_RANK: 3")
        self.announced = {s.fields["seen"] for s in signals if s.rule == "rank_seen"}
        self.ranks |= self.announced
        worlds = [w for s in signals if s.rule == "world" and (w := s.fields["world"]) > 0
                  and w <= MAX_RANKS]  # (a world past it is no job's: bounds.py)
        self.world = max(worlds) if worlds else (max(known_ranks) + 1 if known_ranks else None)
        if self.world is not None and self.ranks and max(self.ranks) >= self.world:
            self.world = None  # contradicts the ranks seen: not the job's world
        self.enqueued: dict[tuple[str, int], int] = {}
        self.hosts_of: dict[int, str] = {}
        for s in signals:
            if "nccl_rank" in s.fields:  # NCCL's init line: which host holds the rank
                self.hosts_of.setdefault(s.fields["nccl_rank"], s.fields["host"])
            if "enqueued" in s.fields and s.line.rank is not None:
                self.enqueued[(pg_of(s), s.line.rank)] = s.fields["enqueued"]
            if s.line.rank is not None and s.line.host:
                self.hosts_of.setdefault(s.line.rank, s.line.host)

    def of_rank(self, rank: int) -> RankActivity | None:
        return self.activity.get(("rank", rank))


def make_finding(p: Problem, ev: Evidence, kind: str, severity: str, summary: str,
                 ranks: list[int], remedy: str | None) -> Finding:
    """A finding of problem `p`: the numbers its messages carried go to `details`."""
    hosts = sorted(p.hosts | {ev.hosts_of[r] for r in ranks if r in ev.hosts_of})
    details = {"signature": "log/" + "/".join(map(str, p.key)), "source": "log",
               "family": p.family, "rule": p.rule, "reporting_ranks": sorted(p.ranks),
               "count": p.count, "lines": samples(p)}
    if hosts:
        details["hosts"] = hosts[:16]
    for k in ("seq", "op", "numel_in", "numel_out", "timeout_ms", "ran_ms", "port",
              "requested", "free", "total", "gpu", "exception", "message", "keys",
              "joined", "world", "cause"):
        v = p.field(k)
        if v is not None:
            details[k] = v
    m = _PG_GUID.search(p.first.line.text)
    if m and m.group(2):
        details["group_desc"] = m.group(2)
    seq = p.field("seq") if isinstance(p.field("seq"), int) else None
    return Finding(kind, severity, summary, ranks=list(ranks), group=m.group(1) if m else None,
                   seq=seq, details=details, remedy=remedy)


def samples(p: Problem) -> list[str]:
    out: list[str] = []
    for s in p.signals:
        t = s.line.text.strip()[:300]
        if t not in out:
            out.append(t)
        if len(out) >= MAX_SAMPLE_LINES:
            break
    return out


# --- words -------------------------------------------------------------------------------
def on(ranks) -> str:
    """" on ranks 0, 1" ("" for none)."""
    return f" on rank{plural(ranks)} {ranks_text(ranks)}" if ranks else ""


def plural(ranks) -> str:
    return "s" if len(ranks) > 1 else ""


def ranks_text(ranks) -> str:
    """"0, 2, 5", or ranges "0-3, 7" when long."""
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


def secs(ms: int) -> str:
    s = int(ms) / 1000
    return f"{s:.0f} s" if s >= 10 else f"{s:g} s"


def short_path(path: str) -> str:
    parts = path.split("/")
    return "/".join(parts[-2:]) if len(parts) > 2 else path


def clip(text: str, n: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[:n - 1] + "…"


def exception_prefix(p: Problem) -> str:
    """"RendezvousTimeoutError: " when a traceback named a telling exception."""
    e = p.field("exception")
    name = e.rsplit(".", 1)[-1] if e else ""
    return f"{name}: " if name and name not in ("RuntimeError", "Exception",
                                                "ValueError") else ""
