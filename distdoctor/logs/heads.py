"""Line heads no rule in lines.py knows, learned from the log itself.

A project's logger puts the same head before every payload: `(VllmWorker rank=0 pid=104) ERROR
09-09 02:24:28 [multiproc_executor.py:522] `, `I0311 app | worker-3 | `, a pod name and a time
stamp. lines.py peels the heads it has a rule for; what it leaves, this module learns the way
a log template miner (Drain) does, on the head only: each line's leading tokens are classed
(a bracketed or parenthesised group, a level word, a date or time, `file.py:123`, `key=value`,
a separator), digits masked, and the class sequence most lines of the file's first MiB share is
the file's head template. A line that starts with that template has it peeled, and the rank
and pid its groups name (`rank=0`, `rank 3`, `Rank3`, `pid=104`) become the line's.

Only tokens that look like a head are ever learned: a payload's words ("Waiting in store ...")
repeated on every line are no head, and a line that does not start with the template keeps
its text whole.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

# the head token classes, in the order they are tried at a position
_KINDS = {
    "group": r"\([^()\n]{1,160}\)|\[(?!(?:PG|Rank) )[^\[\]\n]{1,160}\]|<[^<>\n]{1,80}>",
    "level": r"(?:CRITICAL|ERROR|WARNING|WARN|INFO|DEBUG|TRACE|FATAL|NOTICE)\b:?",
    "time": r"\d[\d:./,T+-]*\d(?:Z|[ap]m)?(?=[\s|\]])",
    "site": r"[\w.-]+\.(?:py|cpp|cc|h|go|rs):\d+(?::\w+)?\]?:?",
    "kv": r"[a-z_]+=[\w.:-]+",
    "sep": r"(?:\||-{1,2}|::?|>>)(?=\s)",
    # "[Rank 3]" after another tag (HCCL's head); first in a line it is c10d's payload
    "rankgroup": r"\[(?:Rank|RANK|rank) ?\d{1,6}\]",
    # "rank 2:", "global_rank=3" (a local rank is no rank: see _RANK)
    "who": r"(?:[Gg]lobal[_ ]|[Ll]ocal[_ ])?(?:[Rr]ank|RANK)[ =_-]?\d{1,6}:?(?=\s)",
    # a name with its details: "HCCL(1234,python):2025-01-01-10:00:00.123"
    "tag": r"[A-Za-z_][\w.-]*\([^()\n]{0,80}\):\S*",  # (with its colon: no code line)
    # a bare name just before a separator: loguru's "worker2 | ", "root - "
    "name": r"[\w.:-]{1,64}(?=[ \t]+(?:\||-{1,2}|>>)[ \t])",
}
# one head token, at the start of what is left; the group name is its class
_TOKEN = re.compile("|".join(f"(?P<{k}>{v})" for k, v in _KINDS.items()))
_SPACE = re.compile(r"[ \t]+")
_RANK = re.compile(r"(?<!local[ _])\b(?:global_)?rank[ =:_-]?(\d{1,6})\b", re.IGNORECASE)
_PID = re.compile(r"\bpid[ =:]?(\d{1,8})\b", re.IGNORECASE)
_LEVELS = {"WARN": "WARNING", "FATAL": "CRITICAL"}
MAX_TOKENS = 8
MIN_SHARE = 0.3  # the template must head this share of the sample's lines


@dataclass(frozen=True, slots=True)
class Head:
    """A file's learned head: the classes of its tokens, in order."""

    kinds: tuple[str, ...]

    def peel(self, text: str) -> tuple[str, int | None, int | None, str | None] | None:
        """(payload, rank, pid, level) when `text` starts with this head, else None."""
        m = _compiled(self.kinds).match(text)
        if m is None:
            return None
        rank = pid = level = None
        tags = " ".join(t for t in m.groups() if t)  # the groups, key=value, the level
        if (r := _RANK.search(tags)) is not None:
            rank = int(r.group(1))
        if (p := _PID.search(tags)) is not None:
            pid = int(p.group(1))
        word = m.groupdict().get("level")
        if word:
            level = _LEVELS.get(word.rstrip(":"), word.rstrip(":"))
        return text[m.end():], rank, pid, level


_CACHE: dict[tuple[str, ...], re.Pattern] = {}


def _compiled(kinds: tuple[str, ...]) -> re.Pattern:
    """A head's token classes as one anchored regex (one match a line, not one a token):
    the tags (groups, key=value) captured, the first level word named."""
    rx = _CACHE.get(kinds)
    if rx is None:
        parts, level = [], False
        for k in kinds:
            pat = f"(?:{_KINDS[k]})"
            if k in ("group", "kv", "who", "tag", "rankgroup"):
                pat = f"({_KINDS[k]})"
            elif k == "level" and not level:
                pat, level = f"(?P<level>{_KINDS[k]})", True
            # a token ends at spaces (a group or a site may be followed at once)
            gap = "[ \t]*" if k in ("group", "site", "tag", "rankgroup") else "(?:[ \t]+|$)"
            parts.append(pat + gap)
        rx = _CACHE[kinds] = re.compile("[ \t]*" + "".join(parts))
    return rx


def _tokens(text: str, limit: int = MAX_TOKENS) -> list[tuple[str, str, int]]:
    """The head tokens at the start of `text`: (class, text, end offset after its spaces)."""
    out: list[tuple[str, str, int]] = []
    i = len(text) - len(text.lstrip(" \t"))  # a head may be indented
    while len(out) < limit:
        m = _TOKEN.match(text, i)
        if m is None:
            break
        j = m.end()
        sp = _SPACE.match(text, j)
        if sp is None and j < len(text) and m.lastgroup not in ("group", "site", "tag",
                                                                 "rankgroup"):
            break  # a head token ends at a space (or a group's bracket)
        end = sp.end() if sp else j
        out.append((m.lastgroup, m.group(0), end))
        i = end
    return out


def learn(texts: list[str]) -> Head | None:
    """The head template most of `texts` (what known layers left of each line) start with:
    the longest class sequence that heads at least MIN_SHARE of the lines, holding a group or
    a level word (a bare time stamp is lines.py's business), or None."""
    # (a traceback's indented source lines are code, never a head to learn from)
    texts = [t for t in texts if t.strip() and not t.startswith(("  ", "\t"))]
    if len(texts) < 2:
        return None
    seqs = Counter()
    for t in texts:
        kinds = tuple(k for k, _, _ in _tokens(t))
        for n in range(1, len(kinds) + 1):
            seqs[kinds[:n]] += 1
    need = max(2, MIN_SHARE * len(texts))
    best = None
    for kinds, n in seqs.items():
        # a head holds a tag or a level word, or a time stamp with more after it (a bare
        # time stamp is lines.py's business), and never starts with a payload's "[Rank N]"
        if n < need or not ({"group", "level", "who", "tag"} & set(kinds)
                            or len(kinds) >= 2 and "time" in kinds) or kinds[0] == "rankgroup":
            continue
        if best is None or len(kinds) > len(best):
            best = kinds
    return Head(best) if best else None
