"""The prefixes of one log file, at C speed: which prefix layers its first MiB shows
(`sniff_file`), and the bytes regex whose groups say who printed each line (`Keys`), from which
the reader counts every line per process without parsing it.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from operator import itemgetter

from distdoctor.logs.bounds import small_int
from distdoctor.logs.decoded import open_log
from distdoctor.logs.heads import Head, learn
from distdoctor.logs.lines import LogLine, parse_line, parse_raw, strip_ansi
from distdoctor.logs.wraps import detect_width

SNIFF_BYTES = 1 << 20
SNIFF_LINES = 20_000
HEAD_LINES = 2_000  # lines a head template is learned from
WINDOW = 1 << 20  # where each chunk's last lines are looked for first
FEW = 64  # processes missing from the window searched one by one below this many

# Prefix layers, outermost first, as bytes regexes with at most one group: the group holds
# what identifies the process, never a time stamp or a counter (keys must stay few).
# They run over whole chunks, lines of any length: linear (as in lines.py), so where a part
# must hold something (a host's digit, Ray's pid=) a lookahead says so once, and the run
# after it is one class that stops where the next token starts.
# a quoted paste ("> ") before everything: peeled, never part of a key
_QUOTE = rb"(?:>[ \t]?)*"
_STAMP = rb"(?:\[?\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?\]?[ \t]+)?"
_HOST = (rb"(?:\d{1,3}(?:\.\d{1,3}){3}|localhost|(?!(?:rank|step|epoch|iter|local_rank)\d)"
         rb"[a-z](?=[a-z0-9-]*\d)[a-z0-9-]*(?:\.[a-z0-9-]+)*)")
_BRACKET = rb"(?:\[\d+\] )?(\[[A-Za-z_][A-Za-z_-]*\d+\]: ?|\[(?:\d+,)?\d+\]<std(?:out|err)>:)?"
_LAYERS: list[tuple[str, bytes]] = [
    ("outer", rb"( *\d{1,6}: |" + _HOST + rb": )?"),
    ("bracket", _BRACKET),
    ("ray", rb"(?:(?:\([^()\n]*\) )*(\((?=[^()\n]*pid=\d)[^()\n]*\)) ?)?"),
    ("bracket2", _BRACKET),
    ("nccl", rb"(?:([\w.-]+:\d+):\d+ \[\d+\] )?"),
    ("glog", rb"(?:[EWIF]\d{3,4} \d\d:\d\d:\d\d(?:\.\d+)? +(\d+) )?"),
]
_SNIFF_RE = re.compile(rb"\n" + _QUOTE + rb"(" + _STAMP + rb")" + b"".join(p for _, p in _LAYERS))
# The common case, torch's "[rankN]:" and nothing else: a literal the regex engine scans fast
# (not tied to a line start: a rank's piece interleaved mid-line counts as its line)
_RANK_ONLY = rb"\[rank(\d+)\]:"

def lines_at(body: bytes, base: int, offsets: dict, texts: dict | None = None) -> dict:
    """{key: (line number, line bytes after its last '\r')} for line-start offsets; where
    `texts` holds an offset, its last text (str) instead of the bytes."""
    out, prev, ln = {}, 0, base
    for k, off in sorted(offsets.items(), key=itemgetter(1)):
        ln += body.count(b"\n", prev, off)
        prev = off
        if texts and off in texts and body[off - 1] == 10:  # a whole line, already parsed
            out[k] = (ln, texts[off])
            continue
        raw = body[off:body.find(b"\n", off)]
        cr = raw.rfind(b"\r")
        out[k] = (ln, raw[cr + 1:][:8192] if cr >= 0 else raw[:8192])
    return out


class Keys:
    """The prefix regex of one file and what each key (tuple of its groups) means."""

    def __init__(self, layers: list[str], path: str, rank: int | None, host: str | None):
        self.layers = layers
        self.rank, self.host, self.path = rank, host, path
        self.known: set = set()
        self._who: dict = {}
        self.counts: Counter = Counter()
        self.firsts: dict = {}  # key -> line number of its first line
        self.lasts: dict = {}  # key -> (line number, bytes) of its last line
        # (body, base, keys present, {key on one line: its offset}) of the previous chunk
        self.prev: tuple | None = None
        self.texts: dict = {}  # line start -> last text, of lines parsed in the last chunk
        self.empty: object = None
        if not layers:
            self.regex = None
        elif layers == ["rank"]:
            self.regex = re.compile(_RANK_ONLY)  # keys: the rank's digits
        else:
            parts = [p for name, p in _LAYERS if name in layers]
            # two groups at least, so findall always gives tuples
            self.regex = re.compile(rb"\n" + _QUOTE + _STAMP + b"".join(parts) + rb"()")
            self.empty = (b"",) * (len(parts) + 1)

    def settle(self, gone: set) -> None:
        """Last lines of the keys `gone` quiet after the previous chunk, found in it."""
        body, base, _, once = self.prev
        # a key on one line of that chunk: its last line is its first, found already
        found = {k: off for k, off in once.items() if k in gone}  # in line order: sorts fast
        rest = gone - found.keys() if found else gone
        if rest:
            found.update(self.positions(body, rest, False))
        self.lasts.update(lines_at(body, base, found, self.texts))

    def key_of(self, m: re.Match):
        return m.group(1) if self.empty is None else m.groups(b"")

    def keyed(self, body: bytes, nl: int) -> bool:
        if self.regex is None:
            return False
        m = self.regex.match(body, nl + (self.empty is None))
        return m is not None and (self.empty is None or any(m.groups(b"")))

    def who(self, key) -> tuple[tuple | None, LogLine | None]:
        if self.empty is None:  # "[rankN]:" alone: the key is N's digits, nothing to parse
            rank = small_int(key)  # (and nothing cached: a million ranks are a million keys)
            if rank is None:  # too long to be a rank: nobody's
                return None, None
            return ("rank", rank), LogLine("x", rank, None, self.host)
        hit = self._who.get(key)
        if hit is None:
            synthetic = []
            if self.empty is None:
                groups, layers = (b"[rank" + key + b"]:",), ["bracket"]
            else:
                groups, layers = key, self.layers
            for name, g in zip(layers, groups, strict=False):
                g = g.decode("utf-8", "replace")
                if not g:
                    continue
                if name == "nccl":
                    synthetic.append(g + ":0 [0] NCCL x")
                elif name == "glog":
                    synthetic.append(f"E0101 00:00:00.000000 {g} x.py:1] x")
                elif name == "ray":
                    synthetic.append(g + " ")
                else:
                    synthetic.append(g)
            line = parse_raw("".join(synthetic) + "x", rank=self.rank, host=self.host)[0]
            hit = self._who[key] = (line.who, line)
        return hit

    def positions(self, body: bytes, want: set, first: bool) -> dict[tuple, int]:
        """Line start of each key's first (or last) line in `body`."""
        found: dict[tuple, int] = {}
        rx = self.regex
        width = WINDOW
        while True:
            if first:
                start, stop = 0, min(len(body), width)
            else:
                start, stop = max(0, len(body) - width - 1), len(body)
            start = body.rfind(b"\n", 0, start + 1) if start else 0
            key_of = self.key_of
            shift = self.empty is not None  # anchored regexes start at the newline
            for m in rx.finditer(body, start, stop):
                k = key_of(m)
                if k in want and (not first or k not in found):
                    found[k] = m.start() + shift
            missing = want - found.keys()
            if len(missing) <= FEW or stop - start >= len(body) - 1:
                break
            # many missing (a million ranks: each chunk's keys all new): the whole chunk at
            # once, not windows growing over it (the same lines found, read once more at most)
            width = len(body)
        for k in missing:
            off = self._search(body, k, first)
            if off is not None:
                found[k] = off
        return found

    def _search(self, body: bytes, key: tuple, first: bool) -> int | None:
        literal = max(key, key=len) if self.empty is not None else b"[rank" + key + b"]:"
        end = len(body)
        i = body.find(literal) if first else body.rfind(literal)
        while i >= 0:
            if self.empty is None:  # the rank literal is the key itself
                return i
            nl = body.rfind(b"\n", 0, i)
            m = self.regex.match(body, nl)
            if m is not None and self.key_of(m) == key:
                return nl + 1
            if first:
                i = body.find(literal, i + 1)
            else:
                end = nl
                i = body.rfind(literal, 0, end) if end > 0 else -1
        return None


def unkeyed_ends(body: bytes, keys: Keys) -> tuple[int, int, bytes]:
    """(first, last) line numbers within `body` of lines no prefix key claims, and the last
    one's bytes: looked for among the chunk's first and last 100 lines (an estimate beyond)."""
    n = body.count(b"\n") - 1
    first, s = 1, 1
    for i in range(1, min(n, 100) + 1):
        if not keys.keyed(body, s - 1):
            first = i
            break
        s = body.find(b"\n", s) + 1
    last, e = n, len(body) - 1
    for i in range(n, max(0, n - 100), -1):
        s = body.rfind(b"\n", 0, e) + 1
        if not keys.keyed(body, s - 1):
            last = i
            break
        e = s - 1
    s = body.rfind(b"\n", 0, e) + 1
    return first, last, body[s:e][-8192:]


# --- sniffing a file -------------------------------------------------------------------------
@dataclass(slots=True)
class Sniff:
    layers: list[str]
    width: int | None
    has_rank: bool
    has_local: bool
    ansi: bool  # colour codes hide prefixes from the fast path's regex: parse every line
    head: Head | None = None  # a head no layer knows, learned (heads.py): parse every line
    first: str = ""  # the first line's message (window.py: does the log start mid-run?)


def sniff_file(path: str) -> Sniff:
    with open_log(path) as fh:
        head = fh.read(SNIFF_BYTES)
    physical = head.split(b"\n")
    if len(physical) > 1:
        physical = physical[:-1]  # the last piece may be cut by the sample's end
    physical = physical[:SNIFF_LINES]
    seen = [0] * (len(_LAYERS) + 1)
    has_rank = has_local = False
    rank_only = True
    for raw in physical:
        m = _SNIFF_RE.match(b"\n" + raw)
        groups = m.groups()
        for i, g in enumerate(groups):
            if g:
                seen[i] += 1
        # who is the rank whenever a line has a "[rankN]:" outermost: inner layers (an NCCL
        # head, a glog pid) change nothing, and one literal regex can count the lines
        if groups[0] or any(groups[1:]) and (groups[1] or groups[3] or groups[4] or not groups[2]
                                or not groups[2].startswith(b"[rank")
                                or raw.startswith(b"[") and not raw.startswith(b"[rank")):
            rank_only = False
        # what the prefixes say (a "[Rank 3]" in a message is no per-line rank label)
        for g in (groups[2], groups[4]):
            if g:
                if g.startswith(b"[rank") or b"<std" in g:
                    has_rank = True
                else:
                    has_local = True
        if groups[1] and groups[1].strip(b" :").isdigit() and not has_local:
            has_rank = True
    layers = [name for i, (name, _) in enumerate(_LAYERS) if seen[i + 1]]
    if "bracket" in layers and rank_only:
        layers = ["rank"]
    text = [strip_ansi(r.decode("utf-8", "replace").rstrip("\r")) for r in physical]
    width = detect_width(text)
    learned = None if width else learn([parse_line(t).text for t in text[:HEAD_LINES]])
    first = next((t for t in text if t.strip()), "")
    first = parse_line(first, head=learned).text if first else ""
    # colour codes, with their ESC or without it (lost in a copy: "[36m(Worker pid=1)[0m ")
    coloured = b"\x1b" in head or b"[0m" in head
    return Sniff(layers, width, has_rank, has_local, coloured, learned, first)
