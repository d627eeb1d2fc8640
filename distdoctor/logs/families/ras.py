"""NCCL RAS (`ncclras`, NCCL >= 2.24): its report of a communicator whose ranks disagree.

The report's "MISMATCH" entries list, per collective, how far each rank got ("7 ranks have
launched up to operation 6215", "Rank 3 has launched up to operation 6214 -- GPU 3 managed
by process 812 on node n01"); the ranks behind never issued the operation the others wait
in. "DEAD" lists processes RAS cannot reach any more; "INCOMPLETE" ranks that did not answer.

Format: NVIDIA/nccl src/ras/client_support.cc (NCCL 2.30.7, the text format of `ncclras`).
"""

from __future__ import annotations

import re

from distdoctor.findings import Finding
from distdoctor.logs import remedies as R
from distdoctor.logs.bounds import MAX_TRACKED
from distdoctor.logs.lines import LogLine
from distdoctor.logs.problems import Problem, plural, ranks_text
from distdoctor.logs.signals import CAUSE, TIMEOUT, Family, Signal

NAME = "ras"

_DIFFERENT = re.compile(r"Communicator ranks have different (?P<op>\w+) operation counts")
# (numbers that are read as ints have at most 18 digits: bounds.MAX_DIGITS)
_GROUP = re.compile(r"^\s*(?P<n>\d{1,18}) ranks have (?:launched up to operation "
                    r"(?P<count>\d{1,18})|(?P<none>not launched any operations))")
_RANK = re.compile(r"^\s*Rank (?P<rank>\d{1,18}) (?:has (?:launched up to operation "
                   r"(?P<count>\d{1,18})|(?P<none>not launched any operations)) )?-- "
                   r"(?:GPU (?P<gpu>\S+) managed by process (?P<pid>\d+) on node (?P<host>\S+)|\[process information)")
_DEAD = re.compile(r"(?<!\d)(?P<n>\d{1,18}) job process(?:es are| is) considered dead")
_DEAD_PROC = re.compile(r"^\s*Process (?P<pid>\d+) on node (?P<host>\S+) managing GPUs? "
                        r"(?P<gpu>\S+)")
_ENTRY = re.compile(r"^#\d+-\d+ \([0-9a-f]+\) (?P<what>MISMATCH|ERROR|INCOMPLETE)")


class RasFamily(Family):
    name = NAME
    orchestrator = True
    # (the reader hands over the lines after "Communicator ranks have different" and "DEAD":
    # reader.FOLLOW)
    anchors = (b"Communicator ranks have different", b"DEAD", b"operation counts",
               b"ranks have launched", b"ranks have not launched",
               b"has launched up to", b"has not launched any", b"managed by process",
               b"considered dead", b"managing GPU", b") MISMATCH", b") ERROR",
               b") INCOMPLETE")

    def __init__(self):
        self._op: dict | None = None  # the collective whose counts are being listed
        self._group_count: int | None = None
        self._dead: Signal | None = None  # the DEAD entry taking its process lines

    def feed(self, line: LogLine) -> list[Signal]:
        text = line.text
        if _ENTRY.match(text.strip()):
            self._op, self._dead = None, None
            return []
        if m := _DIFFERENT.search(text):
            self._op = {"op": m["op"], "counts": {}, "majority": None}
            self._dead = None
            return [Signal("ras_counts", NAME, TIMEOUT, line, self._op)]
        if self._op is not None:
            if m := _GROUP.match(text):
                self._group_count = 0 if m["none"] else int(m["count"])
                n = int(m["n"])
                if self._op["majority"] is None or n > self._op["majority"][1]:
                    self._op["majority"] = (self._group_count, n)
                return []
            if m := _RANK.match(text):
                count = (0 if m["none"] else int(m["count"])) if (m["count"] or m["none"]) \
                    else self._group_count
                if len(self._op["counts"]) >= MAX_TRACKED:
                    return []  # a report naming more ranks than any job has: the first ones
                if count is not None:
                    self._op["counts"][int(m["rank"])] = count
                if m["host"]:
                    self._op.setdefault("hosts", {})[int(m["rank"])] = m["host"]
                return []
        if m := _DEAD.search(text):
            self._op = None
            self._dead = Signal("ras_dead", NAME, CAUSE, line, {"dead": int(m["n"]), "procs": []})
            return [self._dead]
        if self._dead is not None and (m := _DEAD_PROC.match(text)):
            if len(self._dead.fields["procs"]) < 16:
                self._dead.fields["procs"].append(f"process {m['pid']} on {m['host']} (GPU "
                                                  f"{m['gpu']})")
        return []


# --- what its problems mean ---------------------------------------------------------------
def behind(f: dict) -> tuple[list[int], int | None, int | None]:
    """(the ranks behind, their count, the others' count) of one MISMATCH entry: the
    smaller set of ranks (those that launched fewer operations when the sets are equal)."""
    counts: dict = f.get("counts", {})
    majority = f.get("majority")
    if majority is None and counts:
        values = sorted(counts.values())
        majority = (values[len(values) // 2], 0)
    if majority is None:
        return [], None, None
    odd = {r: c for r, c in counts.items() if c != majority[0]}
    if not odd:
        return [], None, majority[0]
    low = min(odd.values())
    return sorted(r for r, c in odd.items() if c == low), low, majority[0]


def owners(p: Problem, ctx) -> tuple[list[int], str] | None:
    f = p.first.fields
    ranks, theirs, others = behind(f)
    if not ranks:
        return None
    op = f.get("op", "collective")
    hosts = f.get("hosts", {})
    on = sorted({hosts[r] for r in ranks if r in hosts})
    at = f" on {', '.join(on)}" if on else ""
    if theirs < others:
        got = (f"launched no {op} at all" if theirs == 0 else
               f"launched {op} only up to operation {theirs}")
        return ranks, (f": rank{plural(ranks)} {ranks_text(ranks)}{at} {got} while the others "
                       f"reached {others}: never issued the {op} the others wait in")
    return ranks, (f": rank{plural(ranks)} {ranks_text(ranks)}{at} launched {op} up to "
                   f"operation {theirs}, past the others' {others}: an extra {op} the others "
                   f"never called (a branch taken on these ranks only)")


TIMEOUTS = {"ras_counts": (lambda p: "NCCL RAS: communicator ranks have different "
                                     f"{p.first.fields.get('op', '')} operation counts",
                           R.FIND_LATE_RANK)}


def describe(p: Problem, ctx) -> Finding:
    """Processes RAS found dead (it cannot say which ranks they held)."""
    f = p.first.fields
    n = f.get("dead", 1)
    procs = f": {', '.join(f['procs'])}" if f.get("procs") else ""
    return ctx.finding(p, "crash", "error", f"NCCL RAS: {n} job process{'es' if n > 1 else ''} "
                       f"unreachable (considered dead){procs}", [], R.PEER_GONE)
