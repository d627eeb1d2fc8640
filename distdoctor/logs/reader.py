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

A hard-wrapped file (a terminal or a copy-paste cut every line at one width), a file with
ANSI colour codes in its first MiB and one whose lines start with a head no layer knows (learned
from the file: heads.py) take the slow path: physical lines rejoined, every line
parsed. `exact=True` forces that path; it is the
reference the fast path is tested against.

Files, globs and names: files.py; gzip and UTF-16: decoded.py; hard wraps: wraps.py; prefix
keys and sniffing: keys.py. Past bounds.MAX_TRACKED processes, lines are counted, not tracked.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from distdoctor.errors import UserError
from distdoctor.logs.bounds import MAX_TRACKED
from distdoctor.logs.decoded import open_log
from distdoctor.logs.files import expand, numbers_in_names
from distdoctor.logs.keys import Keys, Sniff, lines_at, sniff_file, unkeyed_ends
from distdoctor.logs.lines import LogLine, RankActivity, parse_raw
from distdoctor.logs.wraps import MAX_CARRY, logical_lines

CHUNK = 8 << 20
LAST_TEXT = 300

# anchors whose line's next lines are handed over too: a traceback frame's source line (which
# may name a peer: "dist.recv(tensor, 0)"), its carets, and after the last frame the
# exception's line, whatever its name ("torch._dynamo.exc.Unsupported: ...")
# Reports whose later lines hold no anchor of their own follow the same way: an ActorDiedError's
# "pid:"/"ip:" lines, an NCCL RAS entry's per-rank counts, its list of dead processes. (Words
# with no rare byte would cost the reader a pass over every chunk; these cost nothing.)
FOLLOW = {b'File "': 3, b"ActorDiedError": 8, b"Communicator ranks have different": 40,
          b"DEAD": 20}
RARE = 0.002  # an anchor byte rarer than this in a chunk's sample filters the anchors
SAMPLE = 16 << 10
_DIGITS_MASKED = bytes.maketrans(b"0123456789", b"##########")
MEMO, MEMO_CHARS = 4096, 1024  # masked messages remembered, and the longest remembered
FEW_CANDIDATES = 8  # past this many anchors left to search a chunk for, see _in_line_shapes


class LogReader:
    """Lines of the files `specs` name (paths, globs, .gz), in file order then line order."""

    def __init__(self, specs: list[str], *, chunk_size: int = CHUNK, exact: bool = False):
        self.files = expand(specs)
        self.chunk_size = max(1, chunk_size)
        self.exact = exact
        self.activity: dict[tuple, RankActivity] = {}
        self.total_lines = 0
        self.file_lines: dict[str, int] = {}  # lines per file, once read
        self.total_bytes = 0
        self.truncated = False  # the last file ended mid-line
        self.truncated_files: list[str] = []
        self.damaged: dict[str, str] = {}  # file -> what stopped its reading (decoded.py)
        # lines of processes past the first MAX_TRACKED (counted, not tracked one by one: a
        # log naming millions of ranks must not hold a record per rank)
        self.untracked_lines = 0
        self.wrapped_width: int | None = None
        self._names = numbers_in_names(self.files)
        self._last_raw: dict[tuple, bytes] = {}
        self._ended_mid_line = False
        self.first_text = ""  # the first file's first line, its prefixes peeled (window.py)
        self.heads: dict = {}  # per file, the head it taught (heads.py), for its tail's reading

    def lines(self, anchors: tuple[bytes, ...]) -> Iterator[LogLine]:
        """Every logical line whose message holds one of `anchors` (case-sensitive)."""
        anchors = tuple(a for a in anchors if a)
        texts = tuple(a.decode("utf-8", "replace") for a in anchors)
        for path in self.files:
            try:
                sniff = sniff_file(path)
                self.heads[path] = sniff.head
                if path == self.files[0]:
                    self.first_text = sniff.first
                rank, host = self._identity_from_name(path, sniff)
                if sniff.width is not None:
                    self.wrapped_width = sniff.width
                if self.exact or sniff.width is not None or sniff.ansi or sniff.head:
                    yield from self._slow(path, texts, rank, host, sniff)
                else:
                    yield from self._fast(path, anchors, texts, rank, host, sniff)
            except OSError as exc:
                raise UserError(f"diagnose: cannot read log {path}: "
                                f"{exc.strerror or exc}", 2) from None
        while self._last_raw:  # each raw line let go as its text is made: a million ranks'
            who, raw = self._last_raw.popitem()  # lines are never held twice over
            self.activity[who].last_text = _last_text(raw)

    # --- identity from the file name -------------------------------------------------------
    def _identity_from_name(self, path: str, sniff: Sniff) -> tuple[int | None, str | None]:
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
            if len(self.activity) >= MAX_TRACKED:
                self.untracked_lines += n
                return
            r = line
            act = self.activity[who] = RankActivity(
                r.rank if r else None, r.local_rank if r else None, r.host if r else None,
                first_lineno=first, first_file=label)
        act.lines += n
        if act.file != label or last >= act.last_lineno:
            act.last_lineno, act.file = last, label
            if last_raw is not None:
                self._last_raw[who] = last_raw

    def _note_damage(self, path: str, fh) -> None:
        """A file whose reading stopped early (a .gz cut short or corrupt): what was read
        stands, its end is where the reading stopped."""
        why = getattr(fh, "damage", None)
        if why:
            self.damaged[path] = why
            self._mark_truncated(path)

    def _mark_truncated(self, path: str) -> None:
        if path not in self.truncated_files:
            self.truncated_files.append(path)
        self.truncated = path == self.files[-1]

    # --- slow path: every line parsed ------------------------------------------------------
    def _slow(self, path: str, texts: tuple[str, ...], rank: int | None, host: str | None,
              sniff: Sniff) -> Iterator[LogLine]:
        self._ended_mid_line = False
        with open_log(path) as fh:
            follow = {a.decode(): n for a, n in FOLLOW.items() if a.decode() in texts}
            after_frame = 0  # lines still to hand over after a frame or a report's head
            holds = _Holds(texts)
            lineno = 0
            for lineno, raw in logical_lines(fh, sniff.width, self):
                seen: set = set()
                next_too = 0
                for ll in parse_raw(raw, file=path, lineno=lineno, rank=rank, host=host,
                                    head=sniff.head):
                    who = ll.who
                    if who is not None and who not in seen:
                        seen.add(who)
                        self._count(who, ll, 1, lineno, lineno, path,
                                    raw.encode("utf-8", "replace")[-8192:])
                    if after_frame or holds(ll.text):
                        yield ll
                    for t, n in follow.items():
                        if n > next_too and t in ll.text:
                            next_too = n
                after_frame = max(next_too, after_frame - 1)
            self._note_damage(path, fh)
        self.file_lines[path] = lineno
        if self._ended_mid_line:
            self._mark_truncated(path)

    # --- fast path ------------------------------------------------------------------------
    def _fast(self, path: str, anchors: tuple[bytes, ...], texts: tuple[str, ...],
              rank: int | None, host: str | None, sniff: Sniff) -> Iterator[LogLine]:
        keys = Keys(sniff.layers, path, rank, host)
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
            self._note_damage(path, fh)
        if len(carry) > 1:
            self._mark_truncated(path)
            base += yield from self._chunk(carry + b"\n", base, path, plan, texts, keys,
                                           file_who, file_line)
        self.file_lines[path] = base
        self._fold(keys, path)

    def _chunk(self, body: bytes, base: int, path: str, plan: _AnchorPlan,
               texts: tuple[str, ...], keys: Keys, file_who, file_line):
        """Count and search one chunk (newline first and last); returns its line count."""
        n_lines = body.count(b"\n") - 1
        self.total_lines += n_lines
        keyed = 0
        if keys.regex is not None:
            counts = Counter(keys.regex.findall(body))
            counts.pop(keys.empty, None)
            keyed = sum(counts.values())
            self._keyed_activity(body, base, keys, counts)
        # this chunk's parsed lines' last texts by line start: a key's last line found among
        # them (Keys.settle) takes its text from here, not from a second parse
        texts_at = keys.texts = {}
        if file_who is not None and n_lines > keyed:
            first, last, last_raw = unkeyed_ends(body, keys)
            self._count(file_who, file_line, n_lines - keyed, base + first, base + last, path,
                        last_raw)
        # anchors: the lines they hit, each parsed once, in order
        starts: set[int] = set()  # line starts of the lines anchors hit
        after: set[int] = set()  # lines handed over for the line before them
        last = len(body) - 1
        found = plan.candidates(body)
        # a line can hold only the anchors its chunk holds: test those alone
        texts = tuple(a.decode("utf-8", "replace") for a in found)
        find, rfind, add = body.find, body.rfind, starts.add  # (bound once: a line each)
        for a in found:
            follow = FOLLOW.get(a, 0)
            i = find(a)
            while i >= 0:
                add(rfind(b"\n", 0, i) + 1)
                j = e = find(b"\n", i)
                for _ in range(follow):
                    if j >= last:
                        break
                    add(j + 1)
                    after.add(j + 1)
                    j = find(b"\n", j + 1)
                i = find(a, e)
        prev, lineno = 0, base
        count, rank, host = body.count, keys.rank, keys.host
        keyed = keys.keyed if file_who is None else None
        for s in sorted(starts):
            lineno += count(b"\n", prev, s)
            prev = s
            raw = body[s:find(b"\n", s)]
            unkeyed = keyed is not None and not keyed(body, s - 1)
            text = raw.decode("utf-8", "replace")
            # a message holds only anchors its chunk holds (`texts`: every anchor of the chunk,
            # a superset of the line's own, so the same test as with the line's alone)
            parsed = parse_raw(text, file=path, lineno=lineno, rank=rank, host=host)
            if parsed and len(raw) <= 8192 and b"\r" not in raw:  # _last_text(raw), made
                texts_at[s] = parsed[0].text[:LAST_TEXT] if text.strip() else ""  # here once
            seen: set = set()
            for ll in parsed:
                if unkeyed and (who := ll.who) is not None and who not in seen:
                    seen.add(who)
                    self._count(who, ll, 1, lineno, lineno, path, raw[-8192:])
                if s in after or any(map(ll.text.__contains__, texts)):
                    yield ll
        return n_lines

    def _keyed_activity(self, body: bytes, base: int, keys: Keys, counts: Counter) -> None:
        """Per-file bookkeeping at C speed: counts add up in one Counter; a key's first line
        is looked for only in the chunk where it is new, its last line only in the chunk
        after which it goes quiet (the previous chunk is kept for that)."""
        new_keys = [k for k in counts if k not in keys.known]  # (in order of appearance)
        room = MAX_TRACKED - len(keys.known)
        if len(new_keys) > room:  # the first MAX_TRACKED keys are tracked, the rest counted
            for k in new_keys[max(0, room):]:
                self.untracked_lines += counts.pop(k)
            new_keys = new_keys[:max(0, room)]
        keys.counts.update(counts)
        present = counts.keys()
        new = set(new_keys)
        once: dict = {}  # new keys on one line of this chunk: where (their last line too)
        if new:
            keys.known |= new
            at = keys.positions(body, new, True)
            once = {k: off for k, off in at.items() if counts[k] == 1}
            for k, (ln, _) in lines_at(body, base, at).items():
                keys.firsts[k] = ln
        if keys.prev is not None:
            gone = keys.prev[2] - present
            if gone:
                keys.settle(gone)
        keys.prev = (body, base, set(present), once)

    def _fold(self, keys: Keys, path: str) -> None:
        """A file's keyed counts into `activity`, once the file is read."""
        if keys.prev is not None:
            keys.settle(keys.prev[2])
            keys.prev = None
        for k, n in keys.counts.items():
            last, raw = keys.lasts.pop(k)  # popped: what is folded is not held twice
            first = keys.firsts.pop(k, last)
            who, line = keys.who(k)
            if who is None:
                continue
            self._count(who, line, n, first, last, path, raw)
            raw = self._last_raw.pop(who, None)  # its text now: a million raw lines not kept
            if raw is not None:  # until the end (a later file's later line replaces it)
                self.activity[who].last_text = _last_text(raw)


class _Holds:
    """Whether a message holds one of `texts` (the slow path's test, every line), remembered
    by the message with its digits masked, as the scanner's routes are: an anchor with no
    digit is in a line exactly when it is in the masked line, so lines that differ only in
    numbers (progress lines) are tested once; anchors with a digit are tested each time."""

    def __init__(self, texts: tuple[str, ...]):
        self.plain = tuple(t for t in texts if not any(c.isdigit() or c == "#" for c in t))
        self.digital = tuple(t for t in texts if t not in self.plain)
        self.memory: dict[bytes, bool] = {}

    def __call__(self, text: str) -> bool:
        if self.digital and any(map(text.__contains__, self.digital)):
            return True
        if len(text) > MEMO_CHARS:
            return any(map(text.__contains__, self.plain))
        key = text.encode("utf-8", "surrogatepass").translate(_DIGITS_MASKED)
        hit = self.memory.get(key)
        if hit is None:
            if len(self.memory) >= MEMO:
                self.memory.clear()
            hit = self.memory[key] = any(map(text.__contains__, self.plain))
        return hit


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
        found = [a for a in self.anchors
                 if all(present[b] for b in self.bytes_of[a] if b in present)]
        return _in_line_shapes(body, found) if len(found) > FEW_CANDIDATES else found


def _in_line_shapes(body: bytes, anchors: list[bytes]) -> list[bytes]:
    """`anchors` less those the chunk cannot hold, told from its distinct lines with digits
    taken out: a big log repeats a few shapes (a million ranks' timeouts are one), so each
    absent anchor costs a search of those few lines, not of the whole chunk. Taking digits
    out keeps every anchor without one (and may join a few that are not there: searched
    for in vain, as before); an anchor with a digit is kept."""
    shapes = b"\n".join(set(body.translate(None, b"0123456789").split(b"\n")))
    if len(shapes) > len(body) // 2:
        return anchors  # lines that do not repeat: no cheaper than the chunk itself
    return [a for a in anchors if a in shapes or any(48 <= c <= 57 for c in a)]


def _last_text(raw: bytes | str) -> str:
    """The message of a raw line's last segment (what a terminal shows last), cut; a str is
    that text already (made when the line was parsed for its anchors)."""
    if isinstance(raw, str):
        return raw
    seg = raw.rsplit(b"\r", 1)[-1].decode("utf-8", "replace")
    return _message(seg)[:LAST_TEXT]


def _message(segment: str) -> str:
    return parse_raw(segment)[0].text if segment.strip() else ""
