"""Reading logs as jobs leave them, fast: one or many files, plain or gzip, any prefix shape.

`LogReader(specs).lines(anchors)` yields the logical lines whose message holds an anchor (the
failure families' cheap first test) and, on the side, counts every line per process in
`activity`: how much each rank printed and what it printed last, which is how the cross-rank
reasoning tells a rank that went quiet from one that is absent from the log.

The fast path never runs a Python regex per line. It reads 8 MiB binary chunks cut at the
last newline, finds anchors with `bytes.find` (C speed) and parses only the lines they hit.
Activity comes from one compiled bytes regex per chunk (`findall` into a Counter), built from
the prefix layers sniffed in the file's first MiB; each process's first and last lines are
found from a window at the chunk's end, widened or searched for when a process is absent
from it. Lines of a prefix shape the sniff did not see are counted when they hold an anchor.

A hard-wrapped file (a terminal or a copy-paste cut every line at one width) and a file with
ANSI colour codes in its first MiB take the slow path: physical lines rejoined, every line
parsed. `exact=True` forces that path; it is the
reference the fast path is tested against.

Files, globs and names: files.py; hard wraps: wraps.py.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

from distdoctor.diagnosis.logs.files import expand, numbers_in_names, open_log
from distdoctor.diagnosis.logs.lines import LogLine, RankActivity, parse_raw, strip_ansi
from distdoctor.diagnosis.logs.wraps import MAX_CARRY, detect_width, logical_lines
from distdoctor.errors import UserError

CHUNK = 8 << 20
SNIFF_BYTES = 1 << 20
SNIFF_LINES = 20_000
LAST_TEXT = 300
WINDOW = 1 << 20  # where each chunk's last lines are looked for first
FEW = 64  # processes missing from the window searched one by one below this many

# Prefix layers, outermost first, as bytes regexes with at most one group: the group holds
# what identifies the process, never a time stamp or a counter (keys must stay few).
_STAMP = rb"(?:\[?\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?\]?[ \t]+)?"
_HOST = (rb"(?:\d{1,3}(?:\.\d{1,3}){3}|localhost|(?!(?:rank|step|epoch|iter|local_rank)\d)"
         rb"[a-z][a-z0-9-]*\d[a-z0-9-]*(?:\.[a-z0-9-]+)*)")
_BRACKET = rb"(?:\[\d+\] )?(\[[A-Za-z_][A-Za-z_-]*?\d+\]: ?|\[(?:\d+,)?\d+\]<std(?:out|err)>:)?"
_LAYERS: list[tuple[str, bytes]] = [
    ("outer", rb"( *\d{1,6}: |" + _HOST + rb": )?"),
    ("bracket", _BRACKET),
    ("ray", rb"(?:(?:\([^()\n]*\) )*(\([^()\n]*pid=\d+[^()\n]*\)) ?)?"),
    ("bracket2", _BRACKET),
    ("nccl", rb"(?:([\w.-]+:\d+):\d+ \[\d+\] )?"),
    ("glog", rb"(?:[EWIF]\d{3,4} \d\d:\d\d:\d\d(?:\.\d+)? +(\d+) )?"),
]
_SNIFF_RE = re.compile(rb"\n(" + _STAMP + rb")" + b"".join(p for _, p in _LAYERS))
# The common case, torch's "[rankN]:" and nothing else: a literal the regex engine scans fast
# (not tied to a line start: a rank's piece interleaved mid-line counts as its line)
_RANK_ONLY = rb"\[rank(\d+)\]:"
RARE = 0.002  # an anchor byte rarer than this in a chunk's sample filters the anchors
SAMPLE = 16 << 10


class LogReader:
    """Lines of the files `specs` name (paths, globs, .gz), in file order then line order."""

    def __init__(self, specs: list[str], *, chunk_size: int = CHUNK, exact: bool = False):
        self.files = expand(specs)
        self.chunk_size = max(1, chunk_size)
        self.exact = exact
        self.activity: dict[tuple, RankActivity] = {}
        self.total_lines = 0
        self.total_bytes = 0
        self.truncated = False  # the last file ended mid-line
        self.truncated_files: list[str] = []
        self.wrapped_width: int | None = None
        self._names = numbers_in_names(self.files)
        self._last_raw: dict[tuple, bytes] = {}
        self._ended_mid_line = False

    def lines(self, anchors: tuple[bytes, ...]) -> Iterator[LogLine]:
        """Every logical line whose message holds one of `anchors` (case-sensitive)."""
        anchors = tuple(a for a in anchors if a)
        texts = tuple(a.decode("utf-8", "replace") for a in anchors)
        for path in self.files:
            try:
                sniff = _sniff(path)
                rank, host = self._identity_from_name(path, sniff)
                if sniff.width is not None:
                    self.wrapped_width = sniff.width
                if self.exact or sniff.width is not None or sniff.ansi:
                    yield from self._slow(path, texts, rank, host, sniff.width)
                else:
                    yield from self._fast(path, anchors, texts, rank, host, sniff)
            except OSError as exc:
                raise UserError(f"diagnose: cannot read log {path}: "
                                f"{exc.strerror or exc}", 2) from None
            except EOFError:  # a .gz cut short: what was read stands
                self._mark_truncated(path)
        for who, raw in self._last_raw.items():
            seg = raw.rsplit(b"\r", 1)[-1].decode("utf-8", "replace")
            self.activity[who].last_text = _message(seg)[:LAST_TEXT]
        self._last_raw.clear()

    # --- identity from the file name -------------------------------------------------------
    def _identity_from_name(self, path: str, sniff: _Sniff) -> tuple[int | None, str | None]:
        kind, n = self._names.get(path, (None, None))
        if kind == "rank" and not sniff.has_rank:  # lines that say their rank win
            return n, None
        if kind == "node":
            return None, f"node{n}"
        if kind == "index" and not sniff.has_rank:
            return (None, f"node{n}") if sniff.has_local else (n, None)
        return None, None

    # --- activity bookkeeping ----------------------------------------------------------------
    def _count(self, who: tuple, line: LogLine | None, n: int, first: int, last: int,
               label: str, last_raw: bytes | None) -> None:
        act = self.activity.get(who)
        if act is None:
            r = line
            act = self.activity[who] = RankActivity(
                r.rank if r else None, r.local_rank if r else None, r.host if r else None,
                first_lineno=first, first_file=label)
        act.lines += n
        if act.file != label or last >= act.last_lineno:
            act.last_lineno, act.file = last, label
            if last_raw is not None:
                self._last_raw[who] = last_raw

    def _mark_truncated(self, path: str) -> None:
        if path not in self.truncated_files:
            self.truncated_files.append(path)
        self.truncated = path == self.files[-1]

    # --- slow path: every line parsed ------------------------------------------------------
    def _slow(self, path: str, texts: tuple[str, ...], rank: int | None, host: str | None,
              width: int | None) -> Iterator[LogLine]:
        self._ended_mid_line = False
        with open_log(path) as fh:
            for lineno, raw in logical_lines(fh, width, self):
                seen: set = set()
                for ll in parse_raw(raw, file=path, lineno=lineno, rank=rank, host=host):
                    who = ll.who
                    if who is not None and who not in seen:
                        seen.add(who)
                        self._count(who, ll, 1, lineno, lineno, path,
                                    raw.encode("utf-8", "replace")[-8192:])
                    if any(t in ll.text for t in texts):
                        yield ll
        if self._ended_mid_line:
            self._mark_truncated(path)

    # --- fast path ------------------------------------------------------------------------
    def _fast(self, path: str, anchors: tuple[bytes, ...], texts: tuple[str, ...],
              rank: int | None, host: str | None, sniff: _Sniff) -> Iterator[LogLine]:
        keys = _Keys(sniff.layers, path, rank, host)
        plan = _AnchorPlan(anchors)
        file_line = parse_raw("x", rank=rank, host=host)[0]
        file_who = file_line.who
        base = 0  # lines before the current chunk
        carry = b"\n"  # every buffer starts with the newline that ended the line before it
        with open_log(path) as fh:
            while True:
                data = fh.read(self.chunk_size)
                if not data:
                    break
                self.total_bytes += len(data)
                buf = carry + data
                cut = buf.rfind(b"\n")
                if cut <= 0:
                    if len(buf) < MAX_CARRY:
                        carry = buf
                        continue
                    body, carry = buf + b"\n", b"\n"  # no newline in sight: cut it here
                else:
                    body, carry = buf[:cut + 1], b"\n" + buf[cut + 1:]
                base += yield from self._chunk(body, base, path, plan, texts, keys, file_who,
                                               file_line)
        if len(carry) > 1:
            self._mark_truncated(path)
            yield from self._chunk(carry + b"\n", base, path, plan, texts, keys, file_who,
                                   file_line)
        self._fold(keys, path)

    def _chunk(self, body: bytes, base: int, path: str, plan: _AnchorPlan,
               texts: tuple[str, ...], keys: _Keys, file_who, file_line):
        """Count and search one chunk (newline first and last); returns its line count."""
        n_lines = body.count(b"\n") - 1
        self.total_lines += n_lines
        keyed = 0
        if keys.regex is not None:
            counts = Counter(keys.regex.findall(body))
            counts.pop(keys.empty, None)
            keyed = sum(counts.values())
            self._keyed_activity(body, base, keys, counts)
        if file_who is not None and n_lines > keyed:
            first, last, last_raw = _unkeyed_ends(body, keys)
            self._count(file_who, file_line, n_lines - keyed, base + first, base + last, path,
                        last_raw)
        # anchors: the lines they hit, each parsed once, in order
        starts: set[int] = set()
        for a in plan.candidates(body):
            i = body.find(a)
            while i >= 0:
                s = body.rfind(b"\n", 0, i) + 1
                e = body.find(b"\n", i)
                starts.add(s)
                i = body.find(a, e)
        prev, lineno = 0, base
        for s in sorted(starts):
            lineno += body.count(b"\n", prev, s)
            prev = s
            raw = body[s:body.find(b"\n", s)]
            unkeyed = file_who is None and not keys.keyed(body, s - 1)
            text = raw.decode("utf-8", "replace")
            seen: set = set()
            for ll in parse_raw(text, file=path, lineno=lineno, rank=keys.rank, host=keys.host):
                if unkeyed and ll.who is not None and ll.who not in seen:
                    seen.add(ll.who)
                    self._count(ll.who, ll, 1, lineno, lineno, path, raw[-8192:])
                if any(t in ll.text for t in texts):
                    yield ll
        return n_lines

    def _keyed_activity(self, body: bytes, base: int, keys: _Keys, counts: Counter) -> None:
        """Per-file bookkeeping at C speed: counts add up in one Counter; a key's first line
        is looked for only in the chunk where it is new, its last line only in the chunk
        after which it goes quiet (the previous chunk is kept for that)."""
        keys.counts.update(counts)
        present = counts.keys()
        new = present - keys.known
        if new:
            keys.known |= new
            for k, (ln, _) in _lines_at(body, base, keys.positions(body, new, True)).items():
                keys.firsts[k] = ln
        if keys.prev is not None:
            gone = keys.prev[2] - present
            if gone:
                keys.settle(gone)
        keys.prev = (body, base, set(present))

    def _fold(self, keys: _Keys, path: str) -> None:
        """A file's keyed counts into `activity`, once the file is read."""
        if keys.prev is not None:
            keys.settle(keys.prev[2])
            keys.prev = None
        for k, n in keys.counts.items():
            who, line = keys.who(k)
            if who is None:
                continue
            last, raw = keys.lasts[k]
            self._count(who, line, n, keys.firsts.get(k, last), last, path, raw)


def _lines_at(body: bytes, base: int, offsets: dict) -> dict:
    """{key: (line number, line bytes after its last '\r')} for line-start offsets."""
    out, prev, ln = {}, 0, base
    for k, off in sorted(offsets.items(), key=lambda kv: kv[1]):
        ln += body.count(b"\n", prev, off)
        prev = off
        raw = body[off:body.find(b"\n", off)]
        cr = raw.rfind(b"\r")
        out[k] = (ln, raw[cr + 1:][:8192] if cr >= 0 else raw[:8192])
    return out


class _AnchorPlan:
    """Which anchors can be in a chunk, told by one C pass instead of one search each.

    An anchor holding a byte that is rare in the chunk (an upper-case letter amid progress
    lines) cannot occur there if that byte does not; `bytes.translate` keeps only the rare
    bytes, and what is absent from that rest rules anchors out before any search. Rarity is
    judged on a 16 KiB sample of each chunk; the ruling itself is exact.
    """

    def __init__(self, anchors: tuple[bytes, ...]):
        self.anchors = anchors
        self.bytes_of = {a: tuple(bytes([b]) for b in sorted(set(a))) for a in anchors}
        self.alphabet = sorted({b for bs in self.bytes_of.values() for b in bs})

    def candidates(self, body: bytes) -> list[bytes]:
        mid = len(body) // 2
        sample = body[max(0, mid - SAMPLE // 2):mid + SAMPLE // 2]
        limit = max(1, int(len(sample) * RARE))
        rare = {b for b in self.alphabet if sample.count(b) < limit}
        if not rare:
            return list(self.anchors)
        keep = {b[0] for b in rare}
        rest = body.translate(None, bytes(b for b in range(256) if b not in keep))
        present = {b: b in rest for b in rare}
        return [a for a in self.anchors
                if all(present[b] for b in self.bytes_of[a] if b in present)]


class _Keys:
    """The prefix regex of one file and what each key (tuple of its groups) means."""

    def __init__(self, layers: list[str], path: str, rank: int | None, host: str | None):
        self.layers = layers
        self.rank, self.host, self.path = rank, host, path
        self.known: set = set()
        self._who: dict = {}
        self.counts: Counter = Counter()
        self.firsts: dict = {}  # key -> line number of its first line
        self.lasts: dict = {}  # key -> (line number, bytes) of its last line
        self.prev: tuple | None = None  # (body, base, keys present) of the previous chunk
        self.empty: object = None
        if not layers:
            self.regex = None
        elif layers == ["rank"]:
            self.regex = re.compile(_RANK_ONLY)  # keys: the rank's digits
        else:
            parts = [p for name, p in _LAYERS if name in layers]
            # two groups at least, so findall always gives tuples
            self.regex = re.compile(rb"\n" + _STAMP + b"".join(parts) + rb"()")
            self.empty = (b"",) * (len(parts) + 1)

    def settle(self, gone: set) -> None:
        """Last lines of the keys `gone` quiet after the previous chunk, found in it."""
        body, base, _ = self.prev
        self.lasts.update(_lines_at(body, base, self.positions(body, gone, False)))

    def key_of(self, m: re.Match):
        return m.group(1) if self.empty is None else m.groups(b"")

    def keyed(self, body: bytes, nl: int) -> bool:
        if self.regex is None:
            return False
        m = self.regex.match(body, nl + (self.empty is None))
        return m is not None and (self.empty is None or any(m.groups(b"")))

    def who(self, key) -> tuple[tuple | None, LogLine | None]:
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
            width *= 4
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


def _unkeyed_ends(body: bytes, keys: _Keys) -> tuple[int, int, bytes]:
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
class _Sniff:
    layers: list[str]
    width: int | None
    has_rank: bool
    has_local: bool
    ansi: bool  # colour codes hide prefixes from the fast path's regex: parse every line


def _sniff(path: str) -> _Sniff:
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
    return _Sniff(layers, detect_width(text), has_rank, has_local, b"\x1b" in head)


def _message(segment: str) -> str:
    return parse_raw(segment)[0].text if segment.strip() else ""
