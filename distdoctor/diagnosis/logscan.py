"""Communication errors in a job's output: NCCL, Gloo and c10d store messages turned into
`comm_error` findings with their likely causes and remedies.

Two users: the live engine feeds every line of the job's output as it is printed
(`LogScanner.feed`), and `distdoctor diagnose --log FILE` scans a bare log with no run dir
(`scan_log`). Each distinct problem becomes one finding whatever the number of ranks that
print it; ranks that report it are listed in `details.reporting_ranks`.

Timeouts are reported by the ranks that *waited*. The culprit is a rank that never arrived:
among the ranks the log shows, those that did not report the timeout. When the log shows
no such rank, the finding says the culprit is not in this log rather than guess.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from distdoctor.diagnosis.findings import Finding
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

# --- remedies --------------------------------------------------------------------------
R_FIND_LATE_RANK = (
    "A rank never reached this collective. `distdoctor run` names it within seconds of the "
    "hang, with its stack; post-mortem, enable the Flight Recorder (TORCH_NCCL_TRACE_BUFFER_"
    "SIZE=2000 TORCH_NCCL_DUMP_ON_TIMEOUT=1) and run `distdoctor diagnose --fr-dump PREFIX`. "
    "Raise timeout= in init_process_group only if the step is legitimately slow.")
R_NCCL_SYSTEM = (
    "Usually the network or shared memory: rerun with NCCL_DEBUG=INFO (and NCCL_DEBUG_SUBSYS="
    "INIT,NET) to see which; pin the interface with NCCL_SOCKET_IFNAME; try NCCL_IB_DISABLE=1 "
    "to rule out InfiniBand; in containers give /dev/shm room (--shm-size=1g or --ipc=host).")
R_NCCL_CUDA = (
    "A CUDA call inside NCCL failed: check nvidia-smi for XID errors and memory, rerun with "
    "CUDA_LAUNCH_BLOCKING=1 and NCCL_DEBUG=INFO; a driver/CUDA/NCCL version skew across nodes "
    "also shows this way.")
R_NCCL_USAGE = (
    "Usually two ranks on one GPU or mismatched arguments: call torch.cuda.set_device("
    "LOCAL_RANK) before init_process_group (or pass device_id=), check every rank calls the "
    "same collectives with the same sizes (`distdoctor run` compares them live).")
R_NCCL_REMOTE = (
    "A peer failed first: a rank that exited (see its traceback, an OOM kill in dmesg) or a "
    "network fault. Find the first failure; NCCL_DEBUG=INFO shows which connection broke.")
R_NCCL_INTERNAL = (
    "Often a version skew (NCCL or driver differing across nodes) or a P2P/topology problem: "
    "compare versions on every node, try NCCL_P2P_LEVEL=NVL or NCCL_P2P_DISABLE=1, and rerun "
    "with NCCL_DEBUG=INFO.")
R_SHM = ("NCCL could not allocate shared memory: give the container more /dev/shm "
         "(docker --shm-size=1g or --ipc=host) or set NCCL_SHM_DISABLE=1.")
R_SOCKET = ("A socket between ranks failed: check the address NCCL/Gloo picked is reachable "
            "from every node (NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME=eth0, firewall, MTU), "
            "and NCCL_DEBUG=INFO for the interface in use.")
R_IB = ("InfiniBand transport error: check the links (ibstat, ibv_devinfo), NCCL_IB_HCA, "
        "and try NCCL_IB_DISABLE=1 to confirm the job runs over sockets.")
R_P2P = ("GPU peer-to-peer failed: check ACS/IOMMU settings and `nvidia-smi topo -m`; "
         "NCCL_P2P_LEVEL=NVL or NCCL_P2P_DISABLE=1 works around it.")
R_PEER_GONE = ("A peer process went away mid-collective: the real failure is on the rank "
               "that exited first (its traceback, or an OOM kill in dmesg).")
R_GLOO_TIMEOUT = R_FIND_LATE_RANK.replace("(TORCH_NCCL_TRACE_BUFFER_SIZE=2000 "
                                          "TORCH_NCCL_DUMP_ON_TIMEOUT=1)",
                                          "(TORCH_FR_BUFFER_SIZE=2000)")
R_STORE_JOIN = ("Not every rank reached the rendezvous: check that all nodes started, that "
                "--nnodes/--nproc-per-node match WORLD_SIZE, and that MASTER_ADDR:MASTER_PORT "
                "is reachable from every node.")
R_STORE_CONNECT = ("Could not reach the c10d store at MASTER_ADDR:MASTER_PORT: check rank 0's "
                   "host is up and listening, the address and port, and the firewall.")
R_PORT_IN_USE = ("MASTER_PORT is taken, often by a previous run still alive: pick another "
                 "port (--master-port) or stop the stale job.")
R_STORE_GONE = ("The c10d store's server (rank 0 / the launcher's agent) went away: look for "
                "its failure first.")
R_WATCHDOG_STUCK = ("The NCCL watchdog itself made no progress, usually a CUDA call hung in "
                    "the driver: check nvidia-smi and dmesg for XID errors.")


@dataclass(frozen=True)
class Rule:
    """One message family: how to spot it and what it means."""

    name: str
    pattern: re.Pattern
    severity: str
    summary: str  # str.format over the match's named groups
    remedy: str
    timeout: bool = False  # reported by waiting ranks: culprits are those that did not
    victims: bool = False  # reported by ranks that suffer it (a peer left): culprits unknown


def _rule(name, regex, severity, summary, remedy, timeout=False, victims=False) -> Rule:
    return Rule(name, re.compile(regex), severity, summary, remedy, timeout, victims)


# Most specific first: a line takes the first rule that matches.
RULES: tuple[Rule, ...] = (
    _rule("nccl_watchdog_timeout",
          r"Watchdog caught collective operation timeout: WorkNCCL\(SeqNum=(?P<seq>\d+), "
          r"OpType=(?P<op>\w+)(?:, NumelIn=(?P<numel_in>-?\d+), NumelOut=(?P<numel_out>-?\d+))?"
          r".*?Timeout\(ms\)=(?P<timeout_ms>\d+)\) ran for (?P<ran_ms>\d+) milliseconds",
          "error", "NCCL watchdog timeout in {op} (SeqNum {seq}) after {ran_s} s",
          R_FIND_LATE_RANK, timeout=True),
    _rule("nccl_watchdog_stuck",
          r"watchdog (?:thread )?(?:got stuck|hang) for (?P<secs>\d+) seconds|"
          r"Heartbeat monitor timed out",
          "error", "the NCCL watchdog thread is stuck", R_WATCHDOG_STUCK),
    _rule("nccl_duplicate_gpu",
          r"Duplicate GPU detected\s*:\s*rank (?P<a>\d+) and rank (?P<b>\d+) both on CUDA "
          r"device (?P<device>\w+)",
          "error", "ranks {a} and {b} share CUDA device {device} (Duplicate GPU detected)",
          R_NCCL_USAGE),
    _rule("nccl_system_error", r"NCCL error.*?unhandled system error",
          "error", "NCCL unhandled system error", R_NCCL_SYSTEM),
    _rule("nccl_cuda_error", r"NCCL error.*?unhandled cuda error|ncclUnhandledCudaError",
          "error", "NCCL unhandled CUDA error", R_NCCL_CUDA),
    _rule("nccl_invalid_usage", r"NCCL error.*?invalid (?:usage|argument)|ncclInvalidUsage",
          "error", "NCCL invalid usage", R_NCCL_USAGE),
    _rule("nccl_remote_error",
          r"NCCL error.*?remote process exited|ncclRemoteError",
          "error", "NCCL remote error: a peer exited or the network failed", R_NCCL_REMOTE, victims=True),
    _rule("nccl_internal_error", r"NCCL error.*?internal (?:check failed|error)|"
          r"ncclInternalError",
          "error", "NCCL internal error", R_NCCL_INTERNAL),
    _rule("nccl_warn_shm", r"NCCL WARN.*?(?:/dev/shm|shm_open|[Ss]hared memory)",
          "error", "NCCL could not set up shared memory", R_SHM),
    _rule("nccl_warn_ib", r"NCCL WARN.*?(?:NET/IB|ibv_|IB ?:)", "warning",
          "NCCL InfiniBand warning", R_IB),
    _rule("nccl_warn_socket",
          r"NCCL WARN.*?(?:NET/Socket|Bootstrap|[Cc]onnect(?:ion)? (?:to|refused|timed out)|"
          r"no socket interface)",
          "warning", "NCCL socket/bootstrap warning", R_SOCKET),
    _rule("nccl_warn_p2p", r"NCCL WARN.*?(?:P2P|peer access|cudaIpc)", "warning",
          "NCCL peer-to-peer warning", R_P2P),
    _rule("nccl_warn_cuda", r"NCCL WARN.*?Cuda failure", "error",
          "NCCL saw a CUDA failure", R_NCCL_CUDA),
    _rule("nccl_warn", r"NCCL WARN\s+(?P<message>.*)", "warning",
          "NCCL WARN: {message}", "Rerun with NCCL_DEBUG=INFO for the context of this warning."),
    _rule("gloo_timeout",
          r"gloo.*?Timed out waiting (?P<timeout_ms>\d+)ms for (?P<op>\w+) operation",
          "error", "Gloo timed out after {timeout_s} s waiting for a {op}", R_GLOO_TIMEOUT,
          timeout=True),
    _rule("gloo_peer_gone",
          r"gloo.*?(?:Connection closed by peer|Connection reset by peer|Broken pipe)",
          "error", "Gloo lost a peer mid-collective (connection closed)", R_PEER_GONE, victims=True),
    _rule("gloo_connect",
          r"gloo.*?(?:Connection refused|Connect timeout|getaddrinfo|No route to host)",
          "error", "Gloo could not connect to a peer", R_SOCKET),
    _rule("store_join_timeout",
          r"Timed out after (?P<secs>\d+) seconds waiting for clients\. "
          r"(?P<joined>\d+)/(?P<world>\d+) clients joined",
          "error", "rendezvous incomplete: {joined} of {world} ranks joined the c10d store "
          "in {secs} s", R_STORE_JOIN, victims=True),
    _rule("store_client_timeout",
          r"client socket has timed out after (?P<ms>\d+)ms while trying to connect to "
          r"\((?P<host>[^,]+), (?P<port>\d+)\)",
          "error", "could not reach the c10d store at {host}:{port}", R_STORE_CONNECT, victims=True),
    _rule("store_port_in_use",
          r"(?:server socket has failed to listen|failed to bind).*?port: (?P<port>\d+).*?"
          r"EADDRINUSE|EADDRINUSE.*?port: (?P<port2>\d+)",
          "error", "c10d store port {port} is already in use", R_PORT_IN_USE),
    _rule("store_wait_timeout", r"(?:DistStoreError|Socket Timeout).*?wait timeout after "
          r"(?P<ms>\d+)ms|wait timeout after (?P<ms2>\d+)ms, keys:",
          "error", "c10d store wait timed out: a rank never published its key", R_STORE_JOIN,
          timeout=True),
    _rule("store_gone", r"(?:TCPStore|DistStoreError|DistNetworkError).*?"
          r"(?:failed to recv, got 0 bytes|Connection reset by peer|Broken pipe)",
          "error", "lost the connection to the c10d store", R_STORE_GONE, victims=True),
)

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
        rule, m = _match(line)
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


# Words at least one rule needs: most output is the job's own, and skips every rule at once.
_ANY_RULE = re.compile(r"NCCL|nccl|[Gg]loo|[Ss]tore|Timed out|EADDRINUSE|[Ww]atchdog|"
                       r"Heartbeat|socket|Duplicate GPU")


def _match(line: str) -> tuple[Rule | None, re.Match | None]:
    if not _ANY_RULE.search(line):
        return None, None
    for rule in RULES:
        m = rule.pattern.search(line)
        if m:
            return rule, m
    return None, None


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
