"""TORCH_DISTRIBUTED_DEBUG=DETAIL's own collective check (ProcessGroupWrapper: each rank's
collective fingerprint against rank 0's) and monitored_barrier's report of the ranks that
never arrived."""

from __future__ import annotations

import re

from distdoctor.findings import Finding
from distdoctor.logs import remedies as R
from distdoctor.logs.lines import LogLine
from distdoctor.logs.problems import Problem, plural, ranks_text
from distdoctor.logs.signals import CAUSE, VICTIM, Family, Signal

NAME = "mismatch"

# "Detected mismatch between collectives on ranks. Rank 1 is running collective:
# CollectiveFingerPrint(SequenceNumber=3, OpType=BROADCAST, TensorShape=[4], ...), but Rank 0
# is running collective: CollectiveFingerPrint(...)."
_DETAIL = re.compile(r"Detected mismatch between collectives on ranks\. Rank (?P<rank>\d+) is "
                     r"running (?:collective|inconsistent collective): "
                     r"(?P<mine>CollectiveFingerPrint\(.*?\))(?:, but Rank (?P<other>\d+) is "
                     r"running collective: (?P<theirs>CollectiveFingerPrint\(.*?\)))?"
                     r"(?=\.|,|\s|$)")
_OP = re.compile(r"OpType=(?P<op>\w+)")
_SEQ = re.compile(r"SequenceNumber=(?P<seq>\d+)")
_SHAPE = re.compile(r"TensorShape=(?P<shape>\[[^\]]*\](?:, \[[^\]]*\])*)")
_FROM_RANK = re.compile(r"waiting for send/recv from rank (\d+)")
_MONITORED = re.compile(r"Ranks? (?P<ranks>\d+(?:\s*,\s*\d+)*) failed to pass monitoredBarrier"
                        r"(?: in (?P<ms>\d+) ms)?")


def fingerprint(text: str) -> dict:
    out = {}
    for rx in (_OP, _SEQ, _SHAPE):
        if m := rx.search(text):
            out.update(m.groupdict())
    if "seq" in out:
        out["seq"] = int(out["seq"])
    return out


class MismatchFamily(Family):
    name = NAME
    anchors = (b"Detected mismatch", b"monitoredBarrier")

    def feed(self, line: LogLine) -> list[Signal]:
        text = line.text
        if m := _DETAIL.search(text):
            f = {"rank": int(m["rank"]), "mine": fingerprint(m["mine"])}
            if m["other"] is not None:
                f["other"] = int(m["other"])
                f["theirs"] = fingerprint(m["theirs"])
            return [Signal("detail_mismatch", NAME, CAUSE, line, f)]
        if "successfully reached monitoredBarrier" in text:  # waited for the reporter
            m = _FROM_RANK.search(text)  # the rank torch says to look at (it may be a victim too)
            return [Signal("monitored_barrier_peer", NAME, VICTIM, line,
                           {"from_rank": int(m[1])} if m else {})]
        if m := _MONITORED.search(text):
            ranks = [int(r) for r in re.split(r"\s*,\s*", m["ranks"])]
            f = {"missing": ranks}
            if m["ms"]:
                f["ms"] = int(m["ms"])
            return [Signal("monitored_barrier", NAME, CAUSE, line, f)]
        return []


# --- what its problems mean ---------------------------------------------------------------
def describe(p: Problem, ctx) -> Finding:
    ranks = sorted(p.ranks)
    if p.rule == "monitored_barrier":
        missing = sorted({x for s in p.signals for x in s.fields.get("missing", [])})
        return ctx.finding(p, "hang", "error", f"rank{plural(missing)} {ranks_text(missing)} "
                           f"failed to pass monitoredBarrier (reported by rank{plural(ranks)} "
                           f"{ranks_text(ranks)})", missing, R.MONITORED_BARRIER)
    # DETAIL: each reporting rank compares its fingerprint with rank 0's; the odd ones out
    # are the ranks in the smaller camp
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
    camps = sorted(by_op.values(), key=len)
    culprits = camps[0] if len(camps) > 1 and len(camps[0]) < len(camps[-1]) else sorted(ops)
    text = "; ".join(f"rank{plural(rs)} {ranks_text(rs)}: {op}" for op, rs in by_op.items())
    fnd = ctx.finding(p, "mismatch", "error", f"collective mismatch (TORCH_DISTRIBUTED_DEBUG="
                      f"DETAIL) at sequence number {seq}: {text}", culprits, R.MISMATCH)
    fnd.seq = seq
    fnd.details["ops"] = {str(r): op for r, op in ops.items()}
    return fnd


def _op_text(fp: dict) -> str:
    op = fp.get("op", "?")
    return f"{op} of shape {fp['shape']}" if fp.get("shape") else op


def _barrier_peer(p) -> str:
    r = p.field("from_rank")
    return "ranks waiting in monitored_barrier got errors" + (
        f" from rank {r} (torch: check rank {r}'s logs)" if r is not None else "")


VICTIMS = {"monitored_barrier_peer": _barrier_peer}
