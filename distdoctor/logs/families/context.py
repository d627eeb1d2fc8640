"""Evidence, never findings: how many ranks the job has (so a rank can be named from its
absence only when the log shows the whole world), as launchers and frameworks print it."""

from __future__ import annotations

import re

from distdoctor.logs.lines import LogLine
from distdoctor.logs.signals import CONTEXT, Family, Signal

NAME = "context"

_WORLD = (
    re.compile(r"\bWORLD_SIZE[=: ]+(?P<world>\d+)"),
    re.compile(r"\bworld[_ ]size\b\s*[=:]?\s*(?P<world>\d+)", re.I),
    re.compile(r"MEMBER: \d+/(?P<world>\d+)"),                        # Lightning
    re.compile(r"initialization options: size: (?P<world>\d+)"),      # ProcessGroupNCCL
    re.compile(r"Num processes: (?P<world>\d+)"),                      # Accelerate
    re.compile(r"\bn[Rr]anks[= ](?P<world>\d+)\b"),                    # NCCL INFO
    re.compile(r"\bRank \d+ of (?P<world>\d+)\b"),
)


# a rank saying it exists, in frameworks' own words (its lines may carry no rank prefix)
_RANK = (
    re.compile(r"GLOBAL_RANK: (?P<rank>\d+)"),                         # Lightning
    re.compile(r"Process rank: (?P<rank>\d+)"),                        # HF Trainer, LlamaFactory
    re.compile(r"\[rank: (?P<rank>\d+)\]"),                            # Lightning's rank_zero
)


class ContextFamily(Family):
    name = NAME
    anchors = (b"WORLD_SIZE", b"orld_size", b"orld size", b"MEMBER:", b"options: size",
               b"Num processes", b"nRanks", b"nranks", b"Rank ", b"GLOBAL_RANK",
               b"Process rank", b"[rank: ")

    def feed(self, line: LogLine) -> list[Signal]:
        text, out = line.text, []
        for rx in _WORLD:
            if m := rx.search(text):
                n = int(m["world"])
                if 0 < n <= 1_000_000:
                    out.append(Signal("world", NAME, CONTEXT, line, {"world": n}))
                    break
        for rx in _RANK:
            if m := rx.search(text):
                out.append(Signal("rank_seen", NAME, CONTEXT, line, {"seen": int(m["rank"])}))
                break
        return out
