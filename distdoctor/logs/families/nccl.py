"""NCCL: watchdog and heartbeat timeouts (with each rank's last enqueued/completed work, to
name the rank behind), NCCL errors with their cause taken from the WARN lines before them,
CUDA errors inside NCCL (217 = peer access), duplicate GPUs, remote and transport errors, and
the WARN lines that are harmless.

Formats: torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp and NCCLUtils.hpp (2.1-2.13),
NCCL's src/include/debug.h WARN head and its transport messages (2.18-2.27).
"""

from __future__ import annotations

import re
from collections import deque

from distdoctor.findings import Finding
from distdoctor.logs import remedies as R
from distdoctor.logs.families.nccl_peers import victim_culprit  # noqa: F401 (its meaning)
from distdoctor.logs.families.nccl_warns import ALWAYS_BENIGN, BENIGN_WARN, TOPOLOGY
from distdoctor.logs.lines import LogLine
from distdoctor.logs.problems import Problem, clip, on, secs
from distdoctor.logs.signals import (
    BENIGN,
    CAUSE,
    CONTEXT,
    TIMEOUT,
    VICTIM,
    Family,
    Signal,
    rule,
    then,
)

NAME = "nccl"
_PG = r"(?:\[PG ID (?P<pg_id>\d+) PG GUID (?P<pg>[^\s(\]]+)(?:\((?P<pg_desc>[^)]*)\))? Rank \d+\])?"

RULES = (
    rule("watchdog_timeout", NAME, TIMEOUT,
         r"Watchdog caught collective operation timeout: WorkNCCL\(SeqNum=(?P<seq>\d+)"
         r"(?:, OpType=(?P<op>\w+))?(?:, NumelIn=(?P<numel_in>-?\d+))?"
         r"(?:, NumelOut=(?P<numel_out>-?\d+))?(?:.*?Timeout\(ms\)=(?P<timeout_ms>\d+))?"
         r"(?:\) ran for (?P<ran_ms>\d+) milliseconds)?",
         ints=("seq", "numel_in", "numel_out", "timeout_ms", "ran_ms")),
    # the same line cut short (a pasted window's last line, a terminal's width): the words
    # are the watchdog's alone, whatever is lost after them
    rule("watchdog_timeout", NAME, TIMEOUT,
         r"Watchdog caught collective(?! operation timeout: WorkNCCL)"),
    rule("watchdog_timeout", NAME, TIMEOUT,
         r"Timeout at NCCL work: (?P<seq>\d+), last enqueued NCCL work: (?P<enqueued>-?\d+), "
         r"last completed NCCL work: (?P<completed>-?\d+)",
         ints=("seq", "enqueued", "completed")),
    rule("watchdog_timeout", NAME, TIMEOUT,
         r"Exception \(either an error or timeout\) detected by watchdog at work: (?P<seq>\d+)"
         r"(?:, last enqueued NCCL work: (?P<enqueued>-?\d+))?"
         r"(?:, last completed NCCL work: (?P<completed>-?\d+))?",
         ints=("seq", "enqueued", "completed")),
    # 2.6+: "[PG ID 1 PG GUID 1 Rank 1]  failure detected by watchdog at work sequence id: 1116
    # PG status: last enqueued work: 1118, last completed work: 1115"
    rule("watchdog_timeout", NAME, TIMEOUT,
         r"failure detected by watchdog at work sequence id: (?P<seq>\d+)"
         r"(?:\s*PG status: last enqueued work: (?P<enqueued>-?\d+))?"
         r"(?:, last completed work: (?P<completed>-?\d+))?",
         ints=("seq", "enqueued", "completed")),
    rule("heartbeat_timeout", NAME, TIMEOUT,
         r"Heartbeat monitor timed out|watchdog (?:thread )?(?:got stuck|hang) for "
         r"(?P<secs>\d+) seconds|" + then(r"[Ww]atchdog thread ") + r"(?:stuck|hang)",
         ints=("secs",)),
    rule("progress", NAME, CONTEXT,
         r"[Ll]ast enqueued (?:NCCL )?work: (?P<enqueued>-?\d+), last completed (?:NCCL )?"
         r"work: (?P<completed>-?\d+)", ints=("enqueued", "completed")),
    rule("duplicate_gpu", NAME, CAUSE,
         r"Duplicate GPU detected\s*:\s*rank (?P<a>\d+) and rank (?P<b>\d+) both on CUDA "
         r"device (?P<device>\w+)", ints=("a", "b")),
    rule("p2p", NAME, CAUSE,
         r"(?:Cuda failure (?P<code>217)|peer access is not supported|cudaErrorPeerAccess"
         r"Unsupported|peer mapping resources exhausted|cudaIpc\w{1,64} failed)", ints=("code",)),
    rule("shm", NAME, CAUSE,
         r"(?:Error while (?:creating|attaching to) shared memory segment (?P<path>\S+)"
         r"(?: \(size (?P<size>\d+)\))?|failed to extend (?P<path2>/dev/shm/\S+) to "
         r"(?P<size2>\d+) bytes|shm_open|unable to allocate shared memory|"
         r"posix_fallocate failed)"),
    rule("ib", NAME, CAUSE,
         then(r"NET/IB ?:") + r"(?:Got completion from peer (?P<peer>\S+) with "
         r"(?:error|status=?) ?(?P<status>\d+)|ibv_\w{1,64} failed|failed)|"
         r"Call to ibv_\w{1,64} failed|[Ii]b(?:v)?_reg_mr failed|IBV_WC_\w{1,64}ERR"),
    rule("socket", NAME, CAUSE,
         then(r"NET/Socket|Bootstrap|bootstrap|socket") + r"(?:no socket interface "
         r"found|No usable listening interface|[Cc]onnect(?:ion)? to \S+ failed|"
         r"Connection refused|Connection timed out|socketStartConnect|unexpected EOF|"
         r"[Tt]imeout|failed to connect)"),
    rule("socket", NAME, CAUSE, r"Call to connect returned (?P<error>[^,]+)"),
    # a network plugin's failed request (aws-ofi-nccl: "NET/OFI Request 0x.. completed with
    # error. RC: 113. Error: 2 (UNDELIVERABLE)"): the fabric, seen from the rank that asked
    rule("net_request", NAME, CAUSE, r"NET/(?P<net>\w{1,64}) Request \S+ completed with error"
         r"(?:.*?RC: (?P<rc>\d+))?(?:.*?\((?P<status>[A-Z_]+)\))?"),
    # NCCL 2.29+: a failed NVLink SHARP multicast bind ends communicator init (2.28 warned and
    # fell back: a WARN, which ALWAYS_BENIGN keeps quiet); as the error's "Last error:" line
    rule("nvls", NAME, CAUSE, r"^Failed to bind NVLink SHARP \(NVLS\) Multicast memory(?:.*?"
         r"CUDA error (?P<code>\d+))?", ints=("code",)),
    # src/misc/socket.cc: the peer's end of a socket went away (it died first)
    rule("remote_error", NAME, VICTIM,
         r"Connection closed by remote peer (?P<peer>[\w.:-]+)|"
         r"Call to (?:send|recv)\w* (?:to|from) (?P<peer2>[\w.:-]+)(?:<\d+>)? failed ?: "
         r"(?:Broken pipe|Connection reset by peer)"),
    rule("remote_error", NAME, VICTIM,
         r"ncclRemoteError|remote process exited|[Rr]emote error|"
         + then("NCCL error") + "remote process"),
    rule("system_error", NAME, CAUSE, r"unhandled system error|ncclSystemError"),
    # graph/topo.cc, misc/utils.cc: the PCI tree under /sys could not be read (a container's
    # /sys, a VM): fatal only when NCCL's error climbs back from it (the "-> N" lines)
    rule("cuda_error", NAME, CAUSE, r"unhandled cuda error|ncclUnhandledCudaError|"
         r"Cuda failure (?P<code>\d+)?\s*'?(?P<msg>[^']*)'?", ints=("code",)),
    rule("invalid_usage", NAME, CAUSE, r"invalid (?:usage|argument)|ncclInvalidUsage|"
         r"ncclInvalidArgument"),
    rule("internal_error", NAME, CAUSE, r"internal (?:check failed|error)|ncclInternalError"),
)

_SPECIFIC = ("p2p", "shm", "ib", "socket", "duplicate_gpu", "topology", "nccl_warn", "nvls",
             "size_mismatch")  # (the last: nccl_sizes.py's)
# "host:pid:tid [dev] NCCL INFO file.cc:123 -> 2": an error code climbing back through NCCL
# init going on after a failed return: NCCL dropped an optional path (an IB plugin on a machine
# with none) and chose another ("Using network Socket", channels, a comm's init)
_ONWARD = re.compile(r"Init (?:COMPLETE|START)|Using network |Channel \d+/\d+|Connected all ")
_CHAIN = re.compile(r"NCCL INFO (?:[\w./-]+:\d+ )?-> (?P<code>\d{1,18})(?!\d)")
_CODES = {1: "ncclUnhandledCudaError", 2: "ncclSystemError", 3: "ncclInternalError",
          4: "ncclInvalidArgument", 5: "ncclInvalidUsage", 6: "ncclRemoteError"}
_COMM = re.compile(r"\bcomm 0x\w+ rank (?P<rank>\d{1,18}) nRanks (?P<world>\d{1,18})(?: nNodes "
                   r"(?P<nodes>\d+))?")
_BOOTSTRAP = re.compile(r"Bootstrap ?: Using (?:\[\d+\])?\w+:(?P<ip>[\d.]+|[\w:]+)<")
_WARN = re.compile(r"NCCL WARN\s*(?P<message>.*)")
_WORLD = re.compile(r"\bn[Rr]anks (?P<world>\d{1,18})\b")
_VERSION = re.compile(r"NCCL version (?P<version>\d+\.\d+\.\d+)")


class NcclFamily(Family):
    name = NAME
    anchors = (b"NCCL", b"nccl", b"atchdog", b"Heartbeat", b"Duplicate GPU", b"Cuda failure",
               b"peer access", b"shared memory", b"ibv_", b"cudaIpc", b"IBV_", b"Bootstrap",
               b"NVLS", b"NET/")
    rules = RULES

    def __init__(self):
        # recent WARN causes per process: an "unhandled system error" takes its cause there
        self._warns: dict[object, deque] = {}
        self._newest: Signal | None = None
        # per NCCL process (host, pid): its last WARN, until a "-> N" line shows it was fatal
        self._open: dict[object, Signal] = {}
        self._fatal: dict[object, Signal] = {}
        self.ip_host: dict[str, str] = {}  # "10.0.0.7" -> "node7", from the Bootstrap lines
        self._uncaused: Signal | None = None  # the last NCCL error that named no cause yet

    def feed(self, line: LogLine) -> list[Signal]:
        text = line.text
        if " NCCL INFO " in text or text.startswith("NCCL INFO"):
            return self._info(line, text)
        w = _WARN.search(text) if "NCCL WARN" in text else None
        out = super().feed(line)
        if out and out[0].rule == "remote_error":
            self._name_peer(out[0])
        if out and out[0].rule in _SPECIFIC:
            # a specific cause (often a WARN, or the "Last error:" after an NCCL error):
            # remembered for the NCCL error that names no cause of its own
            self._remember(line, out[0])
            # an NCCL error's "Last error:" block comes after it: that error's cause
            late = self._uncaused
            if late is not None and late.line.who == line.who and "cause" not in late.fields:
                late.fields["cause"] = self._cause_of(line)
            self._uncaused = None
            return out
        if w and not out:
            message = w["message"][:200]
            benign = BENIGN_WARN.search(message)
            s = Signal("benign_warn" if benign else "warn", NAME, BENIGN, line,
                       {"message": message})
            if not benign:
                self._remember(line, s)
            if not ALWAYS_BENIGN.search(message):
                self._bounded(self._open)[_proc(line)] = s
            return [s]
        if out and out[0].rule in ("system_error", "cuda_error", "internal_error",
                                   "invalid_usage", "remote_error"):
            cause = self._cause_of(line)
            if cause is not None:
                out[0].fields["cause"] = cause
            else:
                self._uncaused = out[0]
        if not out:
            if m := _WORLD.search(text):
                return [Signal("world", NAME, CONTEXT, line, {"world": int(m["world"])})]
            if m := _VERSION.search(text):
                return [Signal("version", NAME, CONTEXT, line, {"version": m["version"]})]
        return out

    def _info(self, line: LogLine, text: str) -> list[Signal]:
        """INFO lines are evidence, never a finding of their own: the world size and which
        host holds which rank, the cause an NCCL error that follows may name ("Call to
        connect returned ..."), and the "-> N" lines that make the WARN before them fatal."""
        if " -> " in text and (m := _CHAIN.search(text)):
            return self._chain(line, int(m["code"]))
        if self._fatal and _ONWARD.search(text):  # got past the WARN: NCCL found another way
            done = self._fatal.pop(_proc(line), None)
            if done is not None:
                done.fields["recovered"] = True
        if "Bootstrap" in text and line.host and (m := _BOOTSTRAP.search(text)):
            if len(self.ip_host) < 100_000:
                self.ip_host[m["ip"]] = line.host
        if m := _WORLD.search(text):
            f = {"world": int(m["world"])}
            if (c := _COMM.search(text)) and line.host:
                f.update(nccl_rank=int(c["rank"]), host=line.host)
            return [Signal("world", NAME, CONTEXT, line, f)]
        for s in super().feed(line):
            if s.rule in _SPECIFIC:
                self._remember(line, s)
        return []

    def _chain(self, line: LogLine, code: int) -> list[Signal]:
        """The first "-> N" after a WARN of the same process: that WARN made NCCL fail."""
        warn = self._open.pop(_proc(line), None)
        if warn is None or code == 0:
            return []
        message = warn.fields.get("message", "")
        rule_name = "topology" if TOPOLOGY.search(message) else "nccl_warn"
        for r in self.rules:
            if r.name in ("socket", "shm", "ib", "p2p") and r.pattern.search(message):
                rule_name = r.name
                break
        s = Signal(rule_name, NAME, CAUSE, warn.line,
                   {"message": message, "code": code, "code_name": _CODES.get(code, str(code))})
        self._remember(warn.line, s)
        self._bounded(self._fatal)[_proc(line)] = s
        return [s]

    def _name_peer(self, s: Signal) -> None:
        peer = s.fields.pop("peer2", None) or s.fields.get("peer")
        if not peer:
            return
        host = peer.split("<")[0].rsplit(":", 1)[0] if peer.count(":") == 1 else peer
        s.fields["peer"] = self.ip_host.get(host, host)

    @staticmethod
    def _bounded(d: dict) -> dict:
        if len(d) > 10_000:  # a huge job's WARNs cannot grow us
            d.pop(next(iter(d)))
        return d

    def _remember(self, line: LogLine, s: Signal) -> None:
        q = self._bounded(self._warns).setdefault(line.who, deque(maxlen=4))
        q.append(s)
        self._newest = s

    def _cause_of(self, line: LogLine) -> dict | None:
        q = self._warns.get(line.who)
        # else the WARN came with NCCL's own head (host:pid), not the rank's prefix
        s = q[-1] if q else self._newest
        if s is None or (not q and s.line.rank is not None):
            return None  # another rank's cause is not this one's
        return {"rule": s.rule, "line": s.line.text[:300], **{
            k: v for k, v in s.fields.items() if isinstance(v, (int, str))}}


def _proc(line: LogLine) -> object:
    """One NCCL process: its (host, pid) from NCCL's own head, else who printed the line."""
    return (line.host, line.pid) if line.pid is not None else line.who


# --- what its problems mean ---------------------------------------------------------------
_GENERIC = ("system_error", "cuda_error", "internal_error", "invalid_usage")
# which specific causes NCCL reports under each generic error code
_EXPLAINS = {"system_error": ("shm", "socket", "ib", "topology", "nccl_warn"),
             "cuda_error": ("p2p", "nvls", "nccl_warn"),
             "internal_error": ("socket", "ib", "p2p", "topology", "nccl_warn", "size_mismatch"),
             "invalid_usage": ("duplicate_gpu", "socket", "nccl_warn", "size_mismatch")}
_CAUSE_TEXT = {"shm": ("shared memory (/dev/shm)", R.SHM), "socket": ("a socket", R.SOCKET),
               "ib": ("InfiniBand", R.IB), "p2p": ("GPU peer-to-peer access", R.P2P),
               "duplicate_gpu": ("two ranks on one GPU", R.NCCL_USAGE),
               "topology": ("NCCL's topology detection (/sys)", R.TOPOLOGY),
               "nvls": ("NVLink SHARP (NVLS) multicast, which needs the Fabric Manager and the "
                        "NVSwitches", R.NVLS),
               "nccl_warn": ("the NCCL WARN before it", R.NCCL_SYSTEM)}


def prepare(causes: list[Problem]) -> list[Problem]:
    """A generic NCCL error ("unhandled system error") with a specific cause in the log (a
    WARN about /dev/shm, a socket, P2P) is that cause's consequence. A socket WARN with no
    NCCL error at all is a warning: NCCL retried and went on."""
    # a WARN whose error code climbed back, in a process that then finished its init anyway
    causes = [p for p in causes if not all(s.fields.get("recovered") for s in p.signals)]
    # NCCL's "unhandled cuda error" on a rank whose CUDA OOM the log shows: that OOM
    ooms = [p for p in causes if p.rule == "cuda_oom"]
    for p in [p for p in causes if p.rule == "cuda_error" and p.family == NAME]:
        oom = next((q for q in ooms if p.ranks <= q.ranks or not p.ranks), None)
        if oom is not None:
            oom.signals.append(p.first)
            causes = [q for q in causes if q is not p]
    specific = [p for p in causes if p.rule in _SPECIFIC]
    if not any(p.rule in _GENERIC for p in causes):
        for p in specific:
            if p.rule == "socket" and all("NCCL WARN" in s.line.text for s in p.signals):
                p.role = "warning"
        return [p for p in causes if p.role == CAUSE]
    if not specific:
        return causes
    kept = []
    for p in causes:
        if p.rule not in _GENERIC:
            kept.append(p)
            continue
        named = (p.field("cause") or {}).get("rule")
        fits = [q for q in specific if q.rule in _EXPLAINS[p.rule]] or specific
        target = next((q for q in fits if q.rule == named), None) or min(
            fits, key=lambda q: abs(q.first.order - p.first.order))
        target.ranks |= p.ranks
        target.signals.append(p.first)
    return kept


def describe(p: Problem, ctx) -> Finding:
    f, r, ranks = p.first.fields, p.rule, sorted(p.ranks)
    where = on(ranks)
    summary, remedy = {
        "duplicate_gpu": (f"ranks {f.get('a')} and {f.get('b')} share CUDA device "
                          f"{f.get('device')} (Duplicate GPU detected)", R.NCCL_USAGE),
        "p2p": ("GPU peer-to-peer access failed (CUDA error 217 'peer access is not supported "
                f"between these two devices'){where}", R.P2P),
        "shm": (f"NCCL could not create its shared memory segment in /dev/shm{where}", R.SHM),
        "ib": (f"InfiniBand transport error{where}: {clip(_after_warn(p), 140)}", R.IB),
        "socket": (f"NCCL socket/bootstrap failure{where}: {clip(_after_warn(p), 140)}",
                   R.SOCKET),
        "topology": (f"NCCL's topology detection failed{where} ({_code(f)}): "
                     f"{clip(f.get('message', ''), 140)}", R.TOPOLOGY),
        "nccl_warn": (f"NCCL failed{where} ({_code(f)}) after: {clip(f.get('message', ''), 140)}",
                      _warn_remedy(f.get("code"))),
        "nvls": (f"NCCL could not bind NVLink SHARP (NVLS) multicast memory{where} (CUDA error "
                 f"{f.get('code', '?')}): the Fabric Manager or the NVSwitches", R.NVLS),
        "net_request": (f"NCCL's network plugin ({f.get('net')}) had a request fail"
                        f"{on(ranks).replace(' on ', ' (seen by ', 1) + (')' if ranks else '')}: RC {f.get('rc', '?')} {f.get('status', '')}; the fabric "
                        f"or a remote process that exited, not that rank", R.NCCL_REMOTE),
        "system_error": (f"NCCL unhandled system error{where}", R.NCCL_SYSTEM),
        "cuda_error": (f"CUDA error in NCCL{where}" + (f": Cuda failure {p.field('code', '')} "
                       f"'{p.field('msg')}'" if p.field("msg") else ""), R.NCCL_CUDA),
        "invalid_usage": (f"NCCL invalid usage{where}", R.NCCL_USAGE),
        "internal_error": (f"NCCL internal error{where}", R.NCCL_INTERNAL),
    }.get(r, (f"{r.replace('_', ' ')}{where}", None))
    cause = p.field("cause") or {}
    if r in _GENERIC and cause.get("rule") in _CAUSE_TEXT:
        # the WARN/INFO line before the error says which: name it, and take its remedy
        what, remedy = _CAUSE_TEXT[cause["rule"]]
        summary = f"{summary}, caused by {what}: {clip(cause['line'], 140)}"
    elif r in _GENERIC and cause.get("line"):
        summary = f"{summary}: {clip(cause['line'], 140)}"
    culprits = sorted({f.get("a"), f.get("b")} - {None}) if r == "duplicate_gpu" else (
        [] if r == "net_request" else ranks)
    return ctx.finding(p, "comm_error", "error", summary, culprits, remedy)


def _code(f: dict) -> str:
    return f"error {f.get('code')}, {f.get('code_name')}" if f.get("code") else "an error"


def _warn_remedy(code) -> str:
    return {1: R.NCCL_CUDA, 3: R.NCCL_INTERNAL, 4: R.NCCL_USAGE, 5: R.NCCL_USAGE,
            6: R.NCCL_REMOTE}.get(code, R.NCCL_SYSTEM)


def _after_warn(p: Problem) -> str:
    t = p.first.line.text
    i = t.find("NCCL WARN")
    return t[i + 9:].strip() if i >= 0 else t.strip()


def _watchdog(p: Problem) -> str:
    f = p.fields()
    op = f" in {f['op']}" if "op" in f else ""
    after = f" after {secs(f['timeout_ms'])}" if "timeout_ms" in f else ""
    seq = f"SeqNum {f['seq']}" if "seq" in f else "its line cut off before the SeqNum"
    return f"NCCL watchdog timeout{op} ({seq}){after}"


def owners(p: Problem, ctx) -> tuple[list[int], str] | None:
    """A heartbeat monitor that fired names its own rank: its watchdog is stuck there."""
    if p.rule != "heartbeat_timeout" or not p.ranks:
        return None
    return sorted(p.ranks), (f": a CUDA or NCCL call hung on "
                             f"{'that rank' if len(p.ranks) == 1 else 'those ranks'}")


TIMEOUTS = {"watchdog_timeout": (_watchdog, R.FIND_LATE_RANK),
            "heartbeat_timeout": (lambda p: "the NCCL watchdog/heartbeat monitor timed out",
                                  R.WATCHDOG_STUCK)}
VICTIMS = {"remote_error": "NCCL remote error: a peer exited or the network failed"}

