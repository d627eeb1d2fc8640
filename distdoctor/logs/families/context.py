"""Evidence, never findings: how many ranks the job has (so a rank can be named from its
absence only when the log shows the whole world), as launchers and frameworks print it."""

from __future__ import annotations

import re
from collections import Counter

from distdoctor.logs.bounds import MAX_RANKS, small_int
from distdoctor.logs.lines import LogLine
from distdoctor.logs.signals import CONTEXT, Family, Signal

NAME = "context"

_WORLD = (
    re.compile(r"\bWORLD_SIZE[=: ]+(?P<world>\d+)"),
    re.compile(r"\bworld[_ ]size\b\s*(?:[=:]\s*)?(?P<world>\d+)", re.I),
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


# NCCL INFO's transport lines name the printing process's rank in its communicator,
# itself first ("[receive]" lines: the peer first): "Channel 00/0 : 0[1020] -> 2[1040] via
# SHM/direct/direct" ("Ring 00 : ..." before 2.6). Format: NCCL src/transport/{p2p,shm,
# net}.cc, 2.4 to 2.2x.
_CHANNEL = re.compile(r"NCCL INFO (?:Channel|Ring) \d+(?:/\d+)? : (?P<a>\d+)\[[0-9a-fx]+\] -> "
                      r"(?P<b>\d+)\[[0-9a-fx]+\](?P<recv> \[receive\])?")


class ContextFamily(Family):
    name = NAME
    anchors = (b"WORLD_SIZE", b"orld_size", b"orld size", b"MEMBER:", b"options: size",
               b"Num processes", b"nRanks", b"nranks", b"Rank ", b"GLOBAL_RANK",
               b"Process rank", b"[rank: ", b"NCCL INFO Channel", b"NCCL INFO Ring")

    def feed(self, line: LogLine) -> list[Signal]:
        text, out = line.text, []
        for rx in _WORLD:
            if m := rx.search(text):
                n = small_int(m["world"])
                if n is not None and 0 < n <= MAX_RANKS:
                    out.append(Signal("world", NAME, CONTEXT, line, {"world": n}))
                    break
        for rx in _RANK:
            if m := rx.search(text):
                if (seen := small_int(m["rank"])) is not None:
                    out.append(Signal("rank_seen", NAME, CONTEXT, line, {"seen": seen}))
                break
        if line.rank is None and line.pid is not None and (m := _CHANNEL.search(text)):
            rank = small_int(m["b"] if m["recv"] else m["a"])
            if rank is not None:
                out.append(Signal("nccl_rank", NAME, CONTEXT, line, {"rank": rank}))
        return out


def assign_nccl_ranks(signals: list[Signal]) -> None:
    """Ranks for the lines of processes NCCL's transport lines name (`host:pid:tid [dev]`
    heads carry the CUDA device, never the rank). Only where it is certain: a process
    whose lines name two ranks is in two communicators, and a rank two processes claim
    is two communicators' numbering; neither is trusted."""
    claimed: dict[tuple, set[int]] = {}
    for s in signals:
        if s.rule == "nccl_rank":
            claimed.setdefault(s.line.who, set()).add(s.fields["rank"])
    one = {who: next(iter(r)) for who, r in claimed.items() if len(r) == 1}
    taken = Counter(one.values())
    ranks = {who: r for who, r in one.items() if taken[r] == 1}
    for s in signals:
        if s.line.rank is None and s.line.who in ranks:
            s.line.rank = ranks[s.line.who]
