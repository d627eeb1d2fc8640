"""TORCH_DISTRIBUTED_DEBUG=DETAIL's own collective check (ProcessGroupWrapper: each rank's
collective fingerprint against rank 0's) and monitored_barrier's report of the ranks that
never arrived."""

from __future__ import annotations

import re

from distdoctor.findings import Finding
from distdoctor.logs import remedies as R
from distdoctor.logs.bounds import small_int
from distdoctor.logs.lines import LogLine
from distdoctor.logs.problems import Problem, plural, ranks_text
from distdoctor.logs.signals import CAUSE, VICTIM, Family, Signal

NAME = "mismatch"

# "Detected mismatch between collectives on ranks. Rank 1 is running collective:
# CollectiveFingerPrint(SequenceNumber=3, OpType=BROADCAST, TensorShape=[4], ...), but Rank 0
# is running collective: CollectiveFingerPrint(...)."
# (read in steps, each a scan forward from where the last stopped: as one regex, a lazy
# fingerprint tried at each ")" with another lazy one inside it read a line of ")" repeated
# in its square)
_FINGERPRINT = "CollectiveFingerPrint("
_DETAIL = re.compile(r"Detected mismatch between collectives on ranks\. Rank (?P<rank>\d+) is "
                     r"running (?:collective|inconsistent collective): " + re.escape(_FINGERPRINT))
_OTHER = re.compile(r", but Rank (?P<other>\d+) is running collective: " + re.escape(_FINGERPRINT))
# a fingerprint ends at the first ")" that ends a word (its own parentheses nest: "(default)")
_FINGERPRINT_END = re.compile(r"\)(?=[.,\s]|$)")
_OP = re.compile(r"OpType=(?P<op>\w+)")
_SEQ = re.compile(r"SequenceNumber=(?P<seq>\d+)")
_SHAPE = re.compile(r"TensorShape=(?P<shape>\[[^\][]*\](?:, \[[^\][]*\])*)")
_FROM_RANK = re.compile(r"waiting for send/recv from rank (\d+)")
_MONITORED = re.compile(r"Ranks? (?P<ranks>\d+(?:\s*,\s*\d+)*) failed to pass monitoredBarrier"
                        r"(?: in (?P<ms>\d+) ms)?")
MAX_NAMED = 4096  # ranks kept of one report's list


def fingerprint(text: str) -> dict:
    out = {}
    for rx in (_OP, _SEQ, _SHAPE):
        if m := rx.search(text):
            out.update(m.groupdict())
    if "seq" in out and (seq := small_int(out["seq"])) is not None:
        out["seq"] = seq
    else:
        out.pop("seq", None)
    return out


def detail_mismatch(text: str) -> dict | None:
    """The fields of DETAIL's mismatch report in `text`: the reporting rank and its
    fingerprint, and the other rank's where the report names it."""
    m = _DETAIL.search(text)
    end = _FINGERPRINT_END.search(text, m.end()) if m else None
    rank = small_int(m["rank"]) if m else None
    if end is None or rank is None:
        return None
    f = {"rank": rank, "mine": fingerprint(text[m.end() - len(_FINGERPRINT):end.end()])}
    o = _OTHER.match(text, end.end())
    theirs = _FINGERPRINT_END.search(text, o.end()) if o else None
    if theirs is not None and (other := small_int(o["other"])) is not None:
        f["other"] = other
        f["theirs"] = fingerprint(text[o.end() - len(_FINGERPRINT):theirs.end()])
    return f


class MismatchFamily(Family):
    name = NAME
    anchors = (b"Detected mismatch", b"monitoredBarrier")

    def feed(self, line: LogLine) -> list[Signal]:
        text = line.text
        if f := detail_mismatch(text):
            return [Signal("detail_mismatch", NAME, CAUSE, line, f)]
        if "successfully reached monitoredBarrier" in text:  # waited for the reporter
            m = _FROM_RANK.search(text)  # the rank torch says to look at (it may be a victim too)
            peer = small_int(m[1]) if m else None
            return [Signal("monitored_barrier_peer", NAME, VICTIM, line,
                           {"from_rank": peer} if peer is not None else {})]
        if m := _MONITORED.search(text):
            ranks = [r for r in map(small_int, re.split(r"\s*,\s*", m["ranks"])[:MAX_NAMED])
                     if r is not None]
            f = {"missing": ranks}
            if m["ms"] and (ms := small_int(m["ms"])) is not None:
                f["ms"] = ms
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
