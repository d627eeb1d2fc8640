"""One line of a job's output, with the prefixes launchers and loggers put on it peeled off.

Real logs arrive wrapped in layers: srun's task label outside torchrun's `[default3]:`,
outside torch's C++ `[rank3]:`, outside a glog head `[E1123 10:37:34.6 ProcessGroupNCCL.cpp:1234]`,
and somewhere an ANSI colour code. `parse_line` peels every layer it knows, innermost last,
then a head learned from the file itself (heads.py), and keeps what each told: rank, local
rank, host, pid, level. What is left is the message, which the failure families match.

It runs on every line `distdoctor run` sees live, so it must be cheap and never raise:
dispatch on the first character, one anchored regex per layer, no search over the message
unless a cheap `in` test says it may pay off. And linear: a line is unbounded text (a
progress bar that never printed a newline, a line naming a million ranks), so no regex here
has a lazy or nested quantifier, nor two adjacent quantifiers over characters they share;
what a regex cannot say that way (c10d's "[PG ... Rank N]") is found by a small scan.

Who printed a line (`LogLine.who`) is the global rank when known; else the local rank on its
host (torchrun's `[default3]:` under a node label); else the pid on its host.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from distdoctor.logs.colours import ANSI as _ANSI
from distdoctor.logs.colours import strip_ansi as strip_ansi  # (re-exported: callers read it here)
from distdoctor.logs.colours import strip_lost_escapes
from distdoctor.logs.heads import Head

# srun --label "3: " (tasks) or pdsh / DeepSpeed's "node1: " / "10.0.0.5: " (hosts): only as the
# outermost layer. A host must look like one (a digit, lower case) so "RuntimeError: " is not:
# its first label holds a digit and no label is empty, checked by _host_like (one regex
# saying that would repeat a group of repeats).
_SRUN = re.compile(r" *(\d{1,6}): ")
_PDSH = re.compile(
    r"(\d{1,3}(?:\.\d{1,3}){3}|localhost|(?!(?:rank|step|epoch|iter|local_rank)\d)"
    r"[a-z][a-z0-9.-]*): ")
# "[rank3]:" (torch, global rank), "[default3]:" / "[trainer3]:" (torchrun's role + local
# rank), optionally after a "[12345] " pid; the Python side puts one space after the colon.
_BRACKET = re.compile(r"(?:\[(\d+)\] )?\[([A-Za-z_][A-Za-z_-]*)(\d+)\]: ?")
# mpirun --tag-output "[1,3]<stderr>:" (job, rank); horovodrun "[3]<stderr>:"
_MPI = re.compile(r"\[(?:\d+,)?(\d+)\]<std(?:out|err)>: ?")
# glog inside brackets, as torch's C++ logs it: "[E1123 10:37:34.617383930 File.cpp:1234] ",
# older "[E ProcessGroupNCCL.cpp:458] ", sometimes with a thread/pid number before the file.
_GLOG_BRACKET = re.compile(
    r"\[([EWIF])(\d{3,4} \d\d:\d\d:\d\d(?:\.\d{1,9})?)?(?: +(\d{1,18}))? ?[^\s\]]+:\d+\] ?")
# bare glog: "E0330 21:37:34.807000 140012 torch/distributed/elastic/.../api.py:869] "
_GLOG = re.compile(r"([EWIF])(\d{3,4} \d\d:\d\d:\d\d(?:\.\d+)?) +(\d+) [^\s\]]+:\d+\] ?")
# a runner relaying a child's streams: "stderr: ", "stdout: "
_STREAM = re.compile(r"std(?:err|out): ")
# Python logging's default format "ERROR:torch.distributed.elastic.multiprocessing.api:"
_PYLOG = re.compile(r"(CRITICAL|ERROR|WARNING|INFO|DEBUG):[\w.<>-]*:")
# vLLM-style "ERROR 10-27 07:48:16 worker_base.py:464] "
_VLLM = re.compile(
    r"(CRITICAL|ERROR|WARNING|WARN|INFO|DEBUG) \d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? [\w.]+:\d+\] ")
# "[2024-05-01 10:00:00,123] ", "2024-05-01T10:00:00.123Z ", "2023-11-01 09:30:02,719\t"
_STAMP = re.compile(
    r"\[?\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?\]?[ \t]+")
# after a time stamp: "[INFO] [launch.py:315:main] ", "torch.distributed.run: [WARNING] ",
# Python logging's "- name - INFO - ",
# "INFO worker.py:1458 -- "
_STAMP_LEVEL = re.compile(
    r"(?:[\w.]+: |- [\w.-]+ - |- )?\[?(CRITICAL|ERROR|WARNING|WARN|INFO|DEBUG|FATAL)\]?[ \t]+"
    r"(?:\[[\w.]+:\d+:\w+\] |[\w.]+:\d+ -- |- )?")
# Ray: "(RayWorkerWrapper pid=123, ip=10.0.0.5) ", "(pid=123) ", "(raylet) ", "(raylet, ip=..) "
_RAY = re.compile(r"\((?:([\w.-]+)(?:,? |(?=\))))?(?:pid=(\d+))?(?:,? ?ip=([\w.:-]+))?\) ?")
_RAY_REPEATED = re.compile(r"\[repeated \d+x across cluster\]")  # cut with all after it
# NCCL's own head "host:pid:tid [dev] NCCL INFO ..." (the device index is not a rank)
_NCCL = re.compile(r"([\w.-]+):(\d+):\d+ \[\d+\] (?=(?:[\w./-]+:\d+ )?NCCL )")
# the rank c10d names in its messages: "[Rank 3]", "[PG ID 0 PG GUID 0(default_pg) Rank 3]",
# "[PG 0 Rank 3]". Only the default group's rank (or a bare "[Rank N]") is a global rank.
# Found from its end ("Rank N]") back to its "[" (see _message_rank): one regex would need
# a lazy run from every "[" to the next "]", quadratic on a line of unclosed brackets.
_RANK_END = re.compile(r"Rank (\d+)\]")
_PG_HEAD = re.compile(r"\[PG (?:ID )?(\d+) ")

# kubectl logs --prefix: "[pod/NAME/CONTAINER] " (the pod is the host)
_POD = re.compile(r"\[pod/([\w.-]+)/[\w.-]+\] ?")

# a line quoted in a reply or an e-mail ("> ", "> > ", ">>"): only outermost, before any
# label; peeled by _unquote

_LEVEL_NAMES = {"WARN": "WARNING", "FATAL": "CRITICAL"}
_MAX_PEELS = 8  # a pathological line cannot loop us


@dataclass(slots=True)
class LogLine:
    """One line of output: the message and what its prefixes said about who printed it."""

    text: str
    rank: int | None = None
    local_rank: int | None = None
    host: str | None = None
    pid: int | None = None
    level: str | None = None
    file: str = ""
    lineno: int = 0
    when: str | None = None  # the time stamp or glog head's time, as printed

    @property
    def who(self) -> tuple | None:
        """The process that printed the line, as precisely as the line tells."""
        if self.rank is not None:
            return ("rank", self.rank)
        if self.local_rank is not None:
            return ("local", self.host, self.local_rank)
        if self.pid is not None:
            return ("pid", self.host, self.pid)
        return None


@dataclass(slots=True)
class RankActivity:
    """What one process printed: how many lines, where, and the last thing it showed."""

    rank: int | None = None
    local_rank: int | None = None
    host: str | None = None
    lines: int = 0
    first_lineno: int = 0
    last_lineno: int = 0
    first_file: str = ""
    file: str = ""  # the file of last_lineno
    last_text: str = ""  # the last segment's message ('\r' redraws: the last one)


# "...155.57 examples/s][E ProcessGroupNCCL.cpp:475] [Rank 2] ...": two writes, no newline
# (or a logger's time stamp: "...1.95s/it][2025-02-11 08:12:03,377] [INFO] [launch.py:319:...")
# (the time's fraction, here and in _GLOG_BRACKET, is "(?:\.\d{1,9})?": "[.\d]*" or "\.\d+" next
# to "[\w./-]+", which takes dots and digits too, read a line of dots or digits in its square)
_GLUED_HEAD = re.compile(r"(?<=\])(?=\[[EWIF](?:\d{3,4} \d\d:\d\d:\d\d(?:\.\d{1,9})?)? *"
                         r"(?:\d+ )?[\w./-]+:\d+\] |\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d[,.]\d+\] )")


def split_segments(raw: str) -> list[str]:
    """A raw line into what a terminal shows as separate lines: '\\r' redraws split apart.

    The trailing newline (LF or CRLF) goes; empty segments are dropped.
    """
    if "\r" not in raw:
        s = raw.rstrip("\n")
        segs = [s] if s else []
    else:
        segs = [s for s in raw.rstrip("\n").split("\r") if s]
    if "][" in raw:  # a C++ log head glued to another write's "]" (a progress bar's end)
        segs = [p for s in segs for p in _GLUED_HEAD.split(s) if p]
    return segs


_INTERLEAVE_HEAD = re.compile(r"(?:\d{1,6}: |[\w.-]+: )?(\[(?:\d+,)?\d+\]<std(?:out|err)>:|"
                              r"\[([A-Za-z_][A-Za-z_-]*)\d+\]:)")

_MPI_KIND = re.compile(r"\[(?:\d+,)?\d+\]<std(?:out|err)>:")


def split_interleaved(segment: str) -> list[str]:
    """Split "[rank1]:foo[rank2]:bar" (two processes' writes mixed mid-line) into its lines.

    Only a prefix of the same kind as the one the segment starts with splits it (a nested
    "[default3]:[rank3]:" does not); the pieces keep the segment's outer srun/pdsh label.
    """
    if segment.count("]:") + segment.count(">:") < 2:
        return [segment]
    m = _INTERLEAVE_HEAD.match(segment)
    if m is None:
        return [segment]
    outer = segment[:m.start(1)]
    kind = (_MPI_KIND if m.group(2) is None
            else re.compile(r"\[" + re.escape(m.group(2)) + r"\d+\]:"))
    cuts = [x.start() for x in kind.finditer(segment, m.end(1))
            if segment[x.start() - 1] != ":"]  # "]:[rank3]:" right after a prefix nests
    if not cuts:
        return [segment]
    out, prev = [], 0
    for c in cuts:
        out.append(segment[prev:c] if prev == 0 else outer + segment[prev:c])
        prev = c
    out.append(outer + segment[prev:])
    return [p for p in out if p.strip()]


def parse_line(segment: str, *, file: str = "", lineno: int = 0, rank: int | None = None,
               host: str | None = None, head: Head | None = None) -> LogLine:
    """Peel every known prefix off one segment (see `split_segments`) and fill the fields.

    `rank` and `host` are what the caller knows (the live launcher, a per-rank file name);
    a prefix or the message saying otherwise wins.
    """
    try:
        line = _parse(segment, file, lineno, rank, host)
        if head is not None and (peeled := head.peel(line.text)) is not None:
            line.text, p_rank, p_pid, p_level = peeled
            if p_rank is not None and (line.rank is None or line.rank == rank):
                line.rank = p_rank
            line.pid = p_pid if p_pid is not None else line.pid
            line.level = p_level or line.level
        return line
    except Exception:  # a malformed line is still a line: never let one stop a scan
        return LogLine(segment, rank, None, host, None, None, file, lineno)


def _parse(s: str, file: str, lineno: int, rank: int | None, host: str | None) -> LogLine:
    if "\x1b" in s:
        s = _ANSI.sub("", s)
    if "[0m" in s or s[:1] == "[" and s[1:2].isdigit():  # (cheap tests first: every line)
        s = strip_lost_escapes(s)
    if "\x00" in s:
        s = s.replace("\x00", "")
    if s[:1] == ">":
        s = _unquote(s)
    p_rank = local = pid = level = when = None
    p_host: str | None = None
    srun: int | None = None
    outer_ok = True  # srun/pdsh labels only outermost (a time stamp may precede them)
    for _ in range(_MAX_PEELS):
        if not s:
            break
        c = s[0]
        m = None
        if c == "[":
            m = _BRACKET.match(s)
            if m is not None:
                role, n = m.group(2), int(m.group(3))
                if m.group(1):
                    pid = int(m.group(1))
                if role == "rank":
                    p_rank = n
                else:
                    local = n
            else:
                m = _MPI.match(s)
                if m is not None:
                    p_rank = int(m.group(1))
                else:
                    m = _GLOG_BRACKET.match(s)
                    if m is not None:
                        level = m.group(1)
                        when = m.group(2) or when
                        if m.group(3):
                            pid = int(m.group(3))
                    else:
                        m = _STAMP.match(s)
                        if m is not None and "]" not in m.group(0):
                            m = None  # "[2025-09-09 02:24:28 TP1] ": a group, not a stamp
                        if m is not None:
                            when = m.group(0)
                            s, level = _after_stamp(s, m)
                            if level is None:
                                continue  # a time stamp is no layer: srun may follow
                            m = _EMPTY  # the level head was peeled with it
                        elif s.startswith("[pod/"):
                            m = _POD.match(s)
                            if m is not None:
                                p_host = p_host or m.group(1)
        elif c == "(":
            m = _RAY.match(s)
            if m is not None and (m.group(2) or m.group(3) or m.group(1) == "raylet"):
                if m.group(2):
                    pid = int(m.group(2))
                if m.group(3):
                    p_host = m.group(3)
            else:
                m = None
        elif c.isdigit() or c == " ":
            m = _STAMP.match(s) if c != " " else None
            if m is not None:
                when = m.group(0)
                s, level = _after_stamp(s, m)
                if level is None:
                    continue
                m = _EMPTY
            elif outer_ok:
                m = _SRUN.match(s)
                if m is not None:
                    srun = int(m.group(1))
                else:
                    m = _pdsh(s)
                    if m is not None:
                        p_host = p_host or m.group(1)
        else:
            if c in "EWIF":
                m = _GLOG.match(s)
                if m is not None:
                    level, when, pid = m.group(1), m.group(2), int(m.group(3))
            if m is None and c in "CEWID":
                m = _PYLOG.match(s) or _VLLM.match(s)
                if m is not None:
                    level = _LEVEL_NAMES.get(m.group(1), m.group(1))
            if m is None and c == "s":
                m = _STREAM.match(s)  # a runner's "stderr: " before each line it relays
            if m is None and ":" in s[:80]:
                m = _NCCL.match(s)
                if m is not None:
                    p_host = p_host or m.group(1)
                    pid = pid if pid is not None else int(m.group(2))
                elif outer_ok:
                    m = _pdsh(s)
                    if m is not None:
                        p_host = p_host or m.group(1)
        if m is None:
            break
        s = s[m.end():]
        outer_ok = False
        if level is not None and not s.startswith("[rank"):
            break  # a log head is the innermost layer (but a logger may relay "[rankN]:")
    if srun is not None:
        # srun labels tasks. One task per rank: the label is the rank. A launcher below it
        # (torchrun's "[default3]:") or a different "[rankK]:" means the task is a node.
        if local is not None or (p_rank is not None and p_rank != srun):
            p_host = p_host or f"node{srun}"
        else:
            p_rank = srun
    if "across cluster]" in s:
        s = _cut_ray_repeated(s)
    if p_rank is None and "Rank " in s:
        found = _message_rank(s)
        if found is not None and found[0] in (None, "0"):
            p_rank = found[1]
    return LogLine(s, p_rank if p_rank is not None else rank,
                   local, p_host if p_host is not None else host, pid, level, file, lineno, when)


_EMPTY = re.compile("").match("")  # a match that peels nothing more


def _unquote(s: str) -> str:
    """`s` without its leading "> ", ">>", "> > " (each ">" may take one blank after it)."""
    i, n = 0, len(s)
    while i < n and s[i] == ">":
        i += 1
        if i < n and s[i] in " \t":
            i += 1
    return s[i:]


def _pdsh(s: str) -> re.Match | None:
    """pdsh's "host: " label at the start of `s`, if its host looks like a host."""
    m = _PDSH.match(s)
    if m is None or not m.group(1)[:1].islower() or m.group(1) == "localhost":
        return m  # an IPv4 address or localhost: the regex said it all
    labels = m.group(1).split(".")
    if "" in labels or not any(c.isdigit() for c in labels[0]):
        return None
    return m


def _cut_ray_repeated(s: str) -> str:
    """Ray's "[repeated 3x across cluster]" dedup note cut off, with all after it and the
    blanks before it."""
    m = _RAY_REPEATED.search(s)
    return s if m is None else s[:m.start()].rstrip()


def _message_rank(s: str) -> tuple[str | None, int] | None:
    """(process group id or None, rank) of the first "[Rank N]" / "[PG [ID] G ... Rank N]"
    in a message.

    Each "Rank N]" closes the bracket opened after the "]" before it; in that stretch the
    first "[PG G " before the "Rank" opens it, else a "[" right before "Rank" does (a bare
    "[Rank N]"). Every stretch is read once: linear in the line.
    """
    for end in _RANK_END.finditer(s):
        start = s.rfind("]", 0, end.start()) + 1
        head = _PG_HEAD.search(s, start, end.start())
        if head is not None:
            return head.group(1), int(end.group(1))
        if end.start() > 0 and s[end.start() - 1] == "[":
            return None, int(end.group(1))
    return None


def _after_stamp(s: str, stamp: re.Match) -> tuple[str, str | None]:
    """The line after a time stamp, with the level head that often follows it peeled too,
    and that level (None when no head follows)."""
    s = s[stamp.end():]
    m = _STAMP_LEVEL.match(s)
    if m is None:
        return s, None
    return s[m.end():], _LEVEL_NAMES.get(m.group(1), m.group(1))


def parse_raw(raw: str, *, file: str = "", lineno: int = 0, rank: int | None = None,
              host: str | None = None, head: Head | None = None) -> list[LogLine]:
    """A raw line as read (maybe with '\\r' redraws and mixed ranks) into its parsed lines."""
    if "\r" not in raw and "][" not in raw and raw.count("]:") + raw.count(">:") < 2:
        seg = raw.rstrip("\n")  # the common line, one segment, one process: no splitting
        if seg and head is None:  # parse_line's work without its call (every anchored line)
            try:
                return [_parse(seg, file, lineno, rank, host)]
            except Exception:  # as parse_line: a malformed line is still a line
                return [LogLine(seg, rank, None, host, None, None, file, lineno)]
        return [parse_line(seg, file=file, lineno=lineno, rank=rank, host=host,
                           head=head)] if seg else []
    out = []
    for seg in split_segments(raw):
        for piece in split_interleaved(seg):
            out.append(parse_line(piece, file=file, lineno=lineno, rank=rank, host=host,
                                  head=head))
    return out
