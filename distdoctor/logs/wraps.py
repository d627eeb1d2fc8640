"""Hard wraps: a terminal or a copy-paste that cut every line of a log at one width.

`detect_width` finds the width from a sample of the file's lines; `logical_lines` reads the
file with the cut pieces joined back into the lines the job printed.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator

from distdoctor.logs.lines import strip_ansi

MAX_LOGICAL = 64 << 10  # a rejoined line stops growing here
MAX_CARRY = 4 << 20  # a "line" with no newline this long is cut (a binary file given by mistake)


def detect_width(lines: list[str]) -> int | None:
    """The width a terminal or an editor hard-wrapped these lines at, or None.

    Wrapped: at most a few lines are longer than some width W >= 60 (pasted unwrapped), at
    least 3 different lines are exactly W long, and the line after each mostly does not start
    the way that line did (it continues it; a new line of the same kind starts alike).
    """
    lengths = Counter(len(s) for s in lines)
    if not lengths:
        return None
    # the width most lines stop at; a few longer lines (pasted unwrapped) do not hide it
    long = {n: c for n, c in lengths.items() if n >= 60}
    if not long:
        return None
    w = next((n for n in sorted(long, reverse=True) if long[n] >= 3 and sum(
        c for m, c in long.items() if m > n) <= max(2, long[n] // 4)), None)
    if w is None:
        return None
    # what follows a full line must be its continuation, not a new line of the same kind:
    # lines that merely happen to share a length (one message printed by every rank) start
    # alike, a wrapped line's next piece does not start the way the line itself did
    full = [(t, nxt) for t, nxt in zip(lines, lines[1:], strict=False) if len(t) == w]
    cont = sum(_head(nxt) != _head(t) for t, nxt in full)
    distinct = len({t for t, _ in full})  # one line repeated is not a wrap
    return w if len(full) >= 3 and cont >= 0.8 * len(full) and distinct >= 3 else None


def _head(line: str) -> str:
    return re.sub(r"\d", "0", line[:6])


_PREFIX_KIND = re.compile(r"(?:\d{1,6}: )?(\[[A-Za-z_]+|\[\d+,|\(\w*)")


def logical_lines(fh, width: int | None, counts) -> Iterator[tuple[int, str]]:
    """(line number of the first piece, text) with hard-wrapped pieces rejoined.

    A piece exactly `width` long continues on the next one (joined with no space: a token may
    be cut mid-word), unless the next starts with the prefix the line itself started with.
    `counts` (the reader) is told the bytes and logical lines read, and whether the file
    ended mid-line.
    """
    pending: list[str] = []
    pending_len = 0
    start_no = 0
    lineno = 0
    kind = None
    while True:
        raw = fh.readline(MAX_CARRY)
        if not raw:
            break
        counts.total_bytes += len(raw)
        lineno += 1
        counts._ended_mid_line = not raw.endswith(b"\n")
        text = raw.decode("utf-8", "replace").rstrip("\n").rstrip("\r")
        visible = len(strip_ansi(text))
        if pending:
            m = _PREFIX_KIND.match(text)
            if (m is not None and m.group(1) == kind) or pending_len >= MAX_LOGICAL:
                counts.total_lines += 1
                yield start_no, "".join(pending)
                pending, pending_len = [], 0
        if not pending:
            start_no = lineno
            m = _PREFIX_KIND.match(text)
            kind = m.group(1) if m else None
        pending.append(text)
        pending_len += len(text)
        if width is None or visible != width or len(set(text)) <= 1:
            counts.total_lines += 1
            yield start_no, "".join(pending)
            pending, pending_len = [], 0
    if pending:
        counts.total_lines += 1
        yield start_no, "".join(pending)
