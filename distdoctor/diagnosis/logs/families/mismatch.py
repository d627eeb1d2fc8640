"""TORCH_DISTRIBUTED_DEBUG=DETAIL's own collective check (ProcessGroupWrapper: each rank's
collective fingerprint against rank 0's) and monitored_barrier's report of the ranks that
never arrived."""

from __future__ import annotations

import re

from distdoctor.diagnosis.logs.lines import LogLine
from distdoctor.diagnosis.logs.signals import CAUSE, VICTIM, Family, Signal

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
            return [Signal("monitored_barrier_peer", NAME, VICTIM, line, {})]
        if m := _MONITORED.search(text):
            ranks = [int(r) for r in re.split(r"\s*,\s*", m["ranks"])]
            f = {"missing": ranks}
            if m["ms"]:
                f["ms"] = int(m["ms"])
            return [Signal("monitored_barrier", NAME, CAUSE, line, f)]
        return []
