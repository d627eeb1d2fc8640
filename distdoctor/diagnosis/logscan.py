"""Communication errors in a job's output: NCCL, Gloo and c10d store messages turned into
`comm_error` findings with their likely causes and remedies.

Two users: the live engine feeds every line of the job's output as it is printed
(`LogScanner.feed`), and `distdoctor diagnose --log FILE` scans a bare log with no run dir
(`scan_log`). Each distinct problem becomes one finding whatever the number of ranks that
print it; ranks that report it are listed in `details.reporting_ranks`.

Timeouts are reported by the ranks that *waited*. The culprit is a rank that never arrived:
among the ranks the log shows, those that did not report the timeout. When the log shows
no such rank, the finding says the culprit is not in this log rather than guess.
The message families themselves, with their causes and remedies, are in `logrules`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from pathlib import Path

from distdoctor.diagnosis.findings import Finding
from distdoctor.diagnosis.logrules import R_PEER_GONE, Rule, match_rule
from distdoctor.errors import UserError

MAX_PROBLEMS = 200  # distinct problems kept; a log full of novel lines cannot grow us
MAX_SAMPLE_LINES = 3
MAX_LINE_CHARS = 4000  # a pathological line (a tensor dump) is cut before matching

# How a line names its rank: torch's C++ log prefix "[rank3]:", torchrun's --tee prefix
# "[default3]:", or the message's own "[Rank 3]" / "[PG ID 0 PG GUID 0(default_pg) Rank 3]".
_RANK_PREFIX = re.compile(r"^\[(?:rank|default|[a-z_]+?)(\d+)\]:")
_RANK_IN_MESSAGE = re.compile(r"\[(?:PG ID \d+ PG GUID [^\]]*? )?Rank (\d+)\]")
# "[PG ID 0 PG GUID 0(default_pg) Rank 3]": the GUID is the group's name (as our tracer
# records it), the parenthesis its description.
_PG_IN_MESSAGE = re.compile(r"\[PG ID \d+ PG GUID ([^\s(\]]+)(?:\(([^)]*)\))?")

# torchrun's failure summary ("Root Cause (first observed failure):" block).
_TR_RANK = re.compile(r"^\s*rank\s*:\s*(?P<rank>\d+) \(local_rank: (?P<local>\d+)\)")
_TR_EXIT = re.compile(r"^\s*exitcode\s*:\s*(?P<code>-?\d+) \(pid: (?P<pid>\d+)\)")
_TR_ROOT = re.compile(r"Root Cause \(first observed failure\)")


class LogScanner:
    """Scans lines one at a time; `feed` returns the findings that are new or changed.

    `crashes=True` also reads torchrun's failure summary (for a bare log: under
    `distdoctor run` exits are seen directly, with more precision).
    """

    def __init__(self, crashes: bool = False):
        self.crashes = crashes
        self.ranks_seen: set[int] = set()
        self._problems: dict[tuple, _Problem] = {}
        self.dropped = 0  # problems beyond MAX_PROBLEMS, counted not kept
        self._in_root_cause = False
        self._tr_rank: tuple[int, int] | None = None
        self._tr_exits: list[dict] = []

    def feed(self, text: str, rank: int | None = None) -> list[Finding]:
        line = text.rstrip("\r\n")[:MAX_LINE_CHARS]
        if rank is None:
            rank = _rank_of(line)
        new_rank = rank is not None and rank not in self.ranks_seen
        if rank is not None:
            self.ranks_seen.add(rank)
        changed = self._torchrun_summary(line) if self.crashes else []
        rule, m = match_rule(line)
        p = None
        if rule is not None:
            key = _key(rule, m, line)
            p = self._problems.get(key)
            if p is None and len(self._problems) >= MAX_PROBLEMS:
                self.dropped += 1
                rule = None
            elif p is None:
                p = self._problems[key] = _Problem(rule, m, key)
        if p is not None:
            p.add(rank, line)
            changed.append(p.finding(self.ranks_seen))
        if new_rank or (p is not None and p.rule.timeout):
            # one more rank known: an open timeout may now name who never arrived
            changed += [q.finding(self.ranks_seen) for q in self._problems.values()
                        if q is not p and q.rule.timeout]
        return changed

    def findings(self) -> list[Finding]:
        out = [p.finding(self.ranks_seen) for p in self._problems.values()]
        return out + self._crash_findings()

    # --- torchrun's summary ------------------------------------------------------------
    def _torchrun_summary(self, line: str) -> list[Finding]:
        if _TR_ROOT.search(line):
            self._in_root_cause = True
            return []
        m = _TR_RANK.match(line)
        if m:
            self._tr_rank = (int(m["rank"]), int(m["local"]))
            self.ranks_seen.add(self._tr_rank[0])
            return []
        m = _TR_EXIT.match(line)
        if m and self._tr_rank is not None:
            self._tr_exits.append({"rank": self._tr_rank[0], "local_rank": self._tr_rank[1],
                                   "exit_code": int(m["code"]), "pid": int(m["pid"]),
                                   "root_cause": self._in_root_cause})
            self._tr_rank = None
            return self._crash_findings()
        return []

    def _crash_findings(self) -> list[Finding]:
        root = [e for e in self._tr_exits if e["root_cause"]]
        if not root:
            return []
        e = root[-1]
        how = (f"killed by signal {-e['exit_code']}" if e["exit_code"] < 0
               else f"exited with code {e['exit_code']}")
        # A rank that failed *because* a collective timed out is where the failure surfaced,
        # not where it began: say so rather than blame it.
        waited = any(p.rule.timeout and e["rank"] in p.reporting
                     for p in self._problems.values())
        if waited:
            summary = (f"rank {e['rank']} {how} after its collective timed out (torchrun's "
                       f"'root cause' is where the failure surfaced, not where it began)")
        else:
            summary = f"rank {e['rank']} {how} first (torchrun's root cause)"
        return [Finding("crash", "warning" if waited else "error", summary,
                        ranks=[] if waited else [e["rank"]],
                        details={"signature": "torchrun_root_cause", "source": "log",
                                 "failures": list(self._tr_exits)},
                        remedy=None if waited else R_PEER_GONE.replace(
                            "A peer process went away mid-collective: the", "The"))]


class _Problem:
    """One distinct problem and the ranks that reported it."""

    def __init__(self, rule: Rule, m: re.Match, key: tuple):
        self.rule = rule
        self.fields = {k: v for k, v in m.groupdict().items() if v is not None}
        self.key = key
        self.reporting: set[int] = set()
        self.count = 0
        self.samples: list[str] = []
        self.pg = _pg_of_line(m.string)

    def add(self, rank: int | None, line: str) -> None:
        self.count += 1
        if rank is not None:
            self.reporting.add(rank)
        if len(self.samples) < MAX_SAMPLE_LINES and line not in self.samples:
            self.samples.append(line.strip())

    def finding(self, ranks_seen: set[int]) -> Finding:
        rule, f = self.rule, dict(self.fields)
        for ms, s in (("timeout_ms", "timeout_s"), ("ran_ms", "ran_s")):
            if ms in f:
                secs = int(f[ms]) / 1000
                f[s] = f"{secs:.0f}" if secs >= 10 else f"{secs:g}"
        f.setdefault("port", f.get("port2"))
        summary = rule.summary.format_map(_Default(f))
        reporting = sorted(self.reporting)
        ranks: list[int] = []
        if rule.timeout:
            ranks = sorted(ranks_seen - self.reporting)
            if reporting:
                summary += f" on rank{'s' if len(reporting) > 1 else ''} " \
                           f"{_ranks_text(reporting)}"
            if ranks:
                summary += f"; rank{'s' if len(ranks) > 1 else ''} {_ranks_text(ranks)} " \
                           f"never reported it: likely never arrived"
            else:
                summary += "; the rank that never arrived is not named in this log"
        elif rule.name == "nccl_duplicate_gpu":
            ranks = sorted({int(f["a"]), int(f["b"])})
        elif rule.victims:  # the rank at fault is elsewhere: name the reporters, blame none
            if reporting:
                summary += f" (seen by rank{'s' if len(reporting) > 1 else ''} " \
                           f"{_ranks_text(reporting)})"
        else:
            ranks = reporting
            if reporting:
                summary += f" (rank{'s' if len(reporting) > 1 else ''} " \
                           f"{_ranks_text(reporting)})"
        details = {"signature": "/".join(map(str, self.key)), "source": "log",
                   "rule": rule.name, "reporting_ranks": reporting, "count": self.count,
                   "lines": list(self.samples)}
        for k in ("seq", "op", "numel_in", "numel_out", "timeout_ms", "ran_ms"):
            if k in self.fields:
                v = self.fields[k]
                details[k] = int(v) if v.lstrip("-").isdigit() else v
        if self.pg and self.pg[1]:
            details["group_desc"] = self.pg[1]
        seq = int(self.fields["seq"]) if "seq" in self.fields else None
        group = self.pg[0] if self.pg else None
        return Finding("comm_error", rule.severity, summary, ranks=ranks, group=group,
                       seq=seq, details=details, remedy=rule.remedy)


class _Default(dict):
    def __missing__(self, key):
        return "?"


def _key(rule: Rule, m: re.Match, line: str) -> tuple:
    """Identity of a problem: what makes two lines the same problem on different ranks."""
    g = m.groupdict()
    if rule.name == "nccl_watchdog_timeout":
        return rule.name, (_pg_of_line(line) or ("",))[0], g["op"], g["seq"]
    if rule.name == "nccl_duplicate_gpu":
        return rule.name, g["device"]
    if rule.name == "nccl_warn":  # one per message shape: numbers (ports, pids) vary
        return rule.name, re.sub(r"\d+", "N", g["message"])[:200]
    if rule.name == "gloo_timeout":
        return rule.name, g["op"], g["timeout_ms"]
    return (rule.name,)


def _rank_of(line: str) -> int | None:
    m = _RANK_PREFIX.match(line) or _RANK_IN_MESSAGE.search(line)
    return int(m.group(1)) if m else None


def _pg_of_line(line: str) -> tuple[str, str | None] | None:
    """(group name, description) of a c10d message that names its process group."""
    m = _PG_IN_MESSAGE.search(line)
    return (m.group(1), m.group(2)) if m else None


def _ranks_text(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks))


def scan_lines(lines: Iterable[str]) -> list[Finding]:
    """Findings of a whole log (every line seen before any culprit is named)."""
    scanner = LogScanner(crashes=True)
    for line in lines:
        scanner.feed(line)
    severity = {"error": 0, "warning": 1, "info": 2}
    found = sorted(scanner.findings(), key=lambda f: severity[f.severity])
    if scanner.dropped:
        for f in found:
            f.details["problems_dropped"] = scanner.dropped
    return found


def scan_log(path: str) -> list[Finding]:
    """`diagnose --log FILE`: a missing or unreadable file is one clear line."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"diagnose: log {path} not found" if not p.exists()
                        else f"diagnose: log {path} is not a file", 2)
    try:
        with open(p, encoding="utf-8", errors="replace") as fh:
            return scan_lines(_lines(fh))
    except OSError as exc:
        raise UserError(f"diagnose: cannot read log {path}: {exc.strerror or exc}", 2) from None


def _lines(fh) -> Iterator[str]:
    # A log with no newlines at all (a binary file given by mistake) must not be read whole
    while chunk := fh.readline(1 << 20):
        yield chunk
