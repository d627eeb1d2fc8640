"""Where the ranks' paths split in the program: the branch that sent them different ways.

Step 2 of where-the-ranks-parted. align.py found the op where the ranks' sequences
parted; here the user's source (source.py) is read at the frames the tracer kept for
each side's op (its line and up to three callers): both sides ran the same code up to
the last op they issued alike, and then one reached a line the other did not. This
module walks the frames to the function where that happened (and into the calls one
side made and the other passed); arms.py reads that function's statements. The
statement between is the innermost `if`/`elif`/`else`, `try`/`except`, `match`, loop
(a `break`, fewer iterations) or early exit (`return`, `continue`, `raise` under an
`if`) whose arms hold the two sides' lines, or a decorator that runs a function on some
ranks only (`@rank_zero_only`). Its condition says whether the split is on the rank's
identity or on the ranks' data (conditions.py), which blame.py reads to say who strayed.
"""

from __future__ import annotations

from distdoctor.diagnosis.parting import arms
from distdoctor.diagnosis.parting import source as S
from distdoctor.diagnosis.parting.callee import into_callee
from distdoctor.runlog.reader import Event

Branch, END = arms.Branch, arms.END  # what find() returns; a side gone

Frame = tuple  # (file, function, line)


def chain(ev: Event | None) -> list[Frame]:
    """The op's frames, outermost first: its callers (as many as the tracer kept), then
    the op's own line."""
    if ev is None or not ev.callsite:
        return []
    cs = ev.callsite
    frames = [(c.get("file"), c.get("function"), c.get("line"))
              for c in reversed(cs.get("callers") or ())]
    return frames + [(cs.get("file"), cs.get("function"), cs.get("line"))]


def _same_function(a: Frame, b: Frame) -> bool:
    return a[0] == b[0] and a[1] == b[1] and a[0] is not None


def _align_frames(c1: list[Frame], c2: list[Frame]) -> tuple[int, int] | None:
    """Where the two chains meet: the first frame of each, from the outermost, in the
    same function (the tracer keeps a few callers only, so one chain may start deeper)."""
    for i, f1 in enumerate(c1):
        for j, f2 in enumerate(c2):
            if _same_function(f1, f2):
                return i, j
    return None


class Unreadable(Exception):
    """The source of the frame where the paths split cannot be read."""

    def __init__(self, path):
        super().__init__(path)
        self.path = path


def _src(path) -> S.Source:
    src = S.read(path)
    if src is None:
        raise Unreadable(path)
    return src


def find(before: Event | None, ev1: Event | None, ev2: Event | None) -> Branch | None:
    """The branch at which side 1 (now at `ev1`: its op at the parting, or what it went
    on to; None: it issued none) and side 2 (at `ev2`) went different ways after both
    issued `before`. None when the frames show none; raises Unreadable when the source
    of the frame that would tell cannot be read."""
    c1, c2, cp = chain(ev1), chain(ev2), chain(before)
    if not c1 and not c2:
        return None
    if not c1 or not c2:  # one side issued nothing more: it left every function
        deeper, side, at = (c1, 0, 0) if c1 else (c2, 1, 0)
        return _descend(deeper, side, at, cp)
    meet = _align_frames(c1, c2)
    if meet is None:  # no function in common (a framework called the user's code): each
        found = [b for b in (_quiet(_descend, c1, 0, 0, cp), _quiet(_descend, c2, 1, 0, cp))
                 if b is not None]  # side's own frames, the rank's identity first
        found.sort(key=lambda b: b.kind != "rank")
        return found[0] if found else None
    i, j = meet
    while i < len(c1) and j < len(c2) and c1[i] == c2[j]:
        i, j = i + 1, j + 1
    if i < len(c1) and j < len(c2) and _same_function(c1[i], c2[j]):
        file, func, l1 = c1[i]
        l2 = c2[j][2]
        src = _src(file)
        fn = S.function_at(src, func, l1)
        after = _line_in(cp, c1[:i], c1[i])
        # a side back at the shared op's own site, by a call of this function that no
        # loop in it repeats, came round to a new call of it: it left the one both were in
        l1 = arms.END if _came_round(c1, cp, fn, l1, after) else l1
        l2 = arms.END if _came_round(c2, cp, fn, l2, after) else l2
        # a side whose line here is the call the shared op came from is still in that call
        in1, in2 = (l1 == after and i + 1 < len(c1)), (l2 == after and j + 1 < len(c2))
        b = None if in1 or in2 else arms.split_in(src, fn, l1, l2, after)
        # the side still in a call the other passed through (or came back round to);
        # a side that left the function (END) is in none of its lines: the other is deeper
        ends = arms.END in (l1, l2)
        if l2 is arms.END or in1 or (not in2 and not ends and after is not None
                                     and l2 <= after < l1):
            deeper, side, at = c1, 0, i + 1
        elif l1 is arms.END or in2 or (not ends and after is not None and l1 <= after < l2):
            deeper, side, at = c2, 1, j + 1
        else:
            deeper, side, at = (c1, 0, i + 1) if l1 < l2 else (c2, 1, j + 1)
        if b is not None and (arms.END in (l1, l2) or b.kind == "rank"
                              or b.exit_line is not None):
            return b
        try:
            inner, unreadable = _descend(deeper, side, at, cp), None
        except Unreadable as exc:
            inner, unreadable = None, exc
        # a condition on the rank's identity further in says more than one on data here,
        # and an early exit further in explains the other side better than an `if` it did
        # not enter here (it entered the call and left it)
        if inner is not None and (b is None or inner.kind == "rank"
                                  or inner.exit_line is not None):
            return inner
        if b is None and unreadable is not None:
            raise unreadable
        return b
    # one chain ends where the other goes on (or the two lines call different
    # functions): the longer one went further in
    if i < len(c1):
        return _descend(c1, 0, i, cp)
    if j < len(c2):
        return _descend(c2, 1, j, cp)
    return None


def _came_round(c: list[Frame], cp: list[Frame], fn, line, after) -> bool:
    """The side's op is at the shared op's site, frame for frame, and no loop of the
    function where the sides meet holds that line: the function was called again."""
    return (bool(cp) and c == cp and line == after
            and not any(isinstance(s, S.LOOPS) for s, _ in S.path_to(fn, line)))


def read(before: Event | None, ev1: Event | None, ev2: Event | None
         ) -> tuple[Branch | None, str | None]:
    """find(), for a diagnosis that must go on whatever the program looks like: the
    branch (or None), and the file whose source could not be read where that stopped
    the reading (or None)."""
    try:
        found = find(before, ev1, ev2)
        return (into_callee(found) if found is not None else None), None
    except Unreadable as exc:
        return None, exc.path
    except (RecursionError, ValueError, IndexError, AttributeError):
        return None, None  # a program shape the reading does not know: said as no branch


def _quiet(fn, *args):
    try:
        return fn(*args)
    except Unreadable:
        return None


def _line_in(cp: list[Frame], prefix: list[Frame], frame: Frame) -> int | None:
    """The line of the shared op `before` in the same call of `frame`'s function (its
    frames above match `prefix`), else None."""
    n = len(prefix)
    if len(cp) > n and cp[:n] == prefix and _same_function(cp[n], frame):
        return cp[n][2]
    # the chains may have been cut at different depths: match by function alone
    for f in cp:
        if _same_function(f, frame):
            return f[2]
    return None


def _descend(deeper: list[Frame], side: int, start: int, cp: list[Frame]) -> Branch | None:
    """The other side passed through (or left) each function of `deeper` from frame
    `start` without reaching its line: the first of them, from the outside in, that
    holds a branch it took the other way (or a rank-only decorator)."""
    for k in range(start, len(deeper)):
        file, func, line = deeper[k]
        src = _src(file)
        fn = S.function_at(src, func, line)
        b = arms.decorated(src, fn, side)
        if b is None:
            b = arms.way_out(src, fn, line, _line_in(cp, deeper[:k], deeper[k]), side)
        if b is not None:
            return b
    return None
