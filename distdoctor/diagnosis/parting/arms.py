"""Within one function: the statement where two lines' paths split (step 2, with
branch.py, of where-the-ranks-parted).

branch.py walks the two sides' frames to the function where their paths part; here that
function's statements (source.py) are read for the branch between a side at one line and
a side at another (or gone out of the function, or come round its loop): the two arms of
an `if`/`try`/`match` that hold the lines, an `if` one side entered and the other passed
by, a loop one side left (a `break`, fewer iterations), an early exit (`return`,
`continue`, `raise` under an `if`), a `try` one side raised out of, a decorator that runs
the function on some ranks, or an `if` whose arm changed what the line sends. A
condition on the rank's identity (conditions.py) is preferred where several could be it.
"""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass, field

from distdoctor.diagnosis.parting import conditions as C
from distdoctor.diagnosis.parting import loops as L
from distdoctor.diagnosis.parting import source as S

END = None  # a side that left the function (or the program) without another op there


@dataclass
class Branch:
    file: str
    line: int
    function: str
    statement: str  # "if", "while", "for", "try", "match", "decorator"
    condition: str  # its source text: "if rank == 0:"
    kind: str  # "rank": on the rank's identity; "data": on what the ranks computed
    # what each side (0: the first side given, 1: the second) did there, in words with
    # {b} for the branch ("entered {b}", "returned early (line 12) under {b}")
    did: list[str] = field(default_factory=lambda: ["", ""])
    inside: list[bool] = field(default_factory=lambda: [False, False])  # op in an arm
    left: list[bool] = field(default_factory=lambda: [False, False])  # took a way out
    # the branch does not hold the op: its arm shaped what the op's line sends (a key
    # added to the dict a metrics call syncs), so the side that entered issued more
    feeds: bool = False
    exit_line: int | None = None  # the `return`/`break`/... a side took under it
    gate: bool = False  # that exit opens the function: the rest is for the ranks let through

    def flip(self) -> None:
        """The same branch with the two sides in the other order."""
        for name in ("did", "inside", "left"):
            setattr(self, name, getattr(self, name)[::-1])

    def where(self) -> str:
        return f"{os.path.basename(self.file)}:{self.line}"

    def as_details(self, sides: list[list[int]]) -> dict:
        return {"file": self.file, "line": self.line, "function": self.function,
                "statement": self.statement, "condition": self.condition,
                "kind": self.kind, "exit_line": self.exit_line,
                "arms": [{"ranks": sorted(r), "did": self.said(k, "it")}
                         for k, r in enumerate(sides)]}

    def said(self, side: int, name: str | None = None) -> str:
        """What `side` did there, the branch named as `name` (default: its condition and
        line)."""
        return self.did[side].replace("{b}", name or f"`{self.condition}` ({self.where()})")


def _rank_guarded(src: S.Source, fn: ast.AST, stmt: ast.AST) -> bool:
    """Whether the statement's condition, or one of the conditions around it in its
    function, reads the rank's identity."""
    tests = [s.test for s, _ in S.path_to(fn, stmt.lineno) if isinstance(s, (ast.If, ast.While))]
    if isinstance(stmt, (ast.If, ast.While)):
        tests.append(stmt.test)
    return any(C.kind_of(src, t) == "rank" for t in tests)


def _header(src: S.Source, stmt: ast.AST) -> tuple[str, str]:
    """(the statement's keyword, its first line as the user wrote it, shortened)."""
    if isinstance(stmt, ast.If):
        word = "elif" if src.text.splitlines()[stmt.lineno - 1].lstrip().startswith("elif") \
            else "if"
        return "if", f"{word} {src.segment(stmt.test)}:"
    if isinstance(stmt, ast.While):
        return "while", f"while {src.segment(stmt.test)}:"
    if isinstance(stmt, (ast.For, ast.AsyncFor)):
        return "for", f"for {src.segment(stmt.target)} in {src.segment(stmt.iter)}:"
    if isinstance(stmt, ast.Try) or type(stmt).__name__ == "TryStar":
        names = [src.segment(h.type) if h.type is not None else "" for h in stmt.handlers]
        return "try", "try: ... except " + ", ".join(n for n in names if n) + ":" if any(
            names) else "try: ... except:"
    if type(stmt).__name__ == "Match":
        return "match", f"match {src.segment(stmt.subject)}:"
    return type(stmt).__name__.lower(), src.segment(stmt)


def _make(src, fn, stmt, did, inside, left) -> Branch:
    word, text = _header(src, stmt)
    kind = "rank" if _rank_guarded(src, fn, stmt) else (
        "exception" if word == "try" else "data")
    return Branch(src.path, stmt.lineno, getattr(fn, "name", "<module>"), word, text,
                  kind, did, inside, left)


def _arm_words(stmt: ast.AST, arm: str) -> str:
    if isinstance(stmt, ast.If):
        return "entered {b}" if arm == "body" else (
            f"took the else (line {stmt.orelse[0].lineno}) of {{b}}")
    if isinstance(stmt, S.LOOPS):
        return "was still in {b}" if arm == "body" else "finished {b}"
    if arm.startswith("handler"):
        h = stmt.handlers[int(arm.split()[1])]
        return f"took the except at line {h.lineno} of {{b}}"
    if arm.startswith("case"):
        return f"took the case at line {stmt.cases[int(arm.split()[1])].lineno} of {{b}}"
    return "stayed in the try of {b}" if arm == "body" else f"was in the {arm} of {{b}}"


def split_in(src, fn, l1, l2, after) -> Branch | None:
    """The statement of `fn` at which a side at line l1 and one at l2 (END: it left the
    function) went different ways, both having passed line `after` (None: unknown)."""
    loop = L.left(fn, l1, l2, after)
    if loop is not None:  # both ran the loop; one side left it, the other went round
        stayed = 0 if loop.lineno <= l1 <= S.end(loop) else 1
        return _left_loop(src, fn, loop, stayed, after, (l1, l2)[stayed])
    for side, mine, other in ((0, l1, l2), (1, l2, l1)):
        if mine is not END and (other is END or (after is not None and other <= after
                                                 and mine > after)):
            # the other side left the function or came round the loop: it passed the
            # rest of the way to `mine` by another path
            return way_out(src, fn, mine, after, side)
    p1 = S.path_to(fn, l1)
    p2 = S.path_to(fn, l2) if l2 is not END else []
    k = 0
    while k < min(len(p1), len(p2)) and p1[k][0] is p2[k][0] and p1[k][1] == p2[k][1]:
        k += 1
    if k < min(len(p1), len(p2)) and p1[k][0] is p2[k][0]:  # one statement, two arms
        stmt = p1[k][0]
        if "finally" in (p1[k][1], p2[k][1]):
            return None  # every path runs the `finally`: it follows the other arm
        if not isinstance(stmt, (ast.With, ast.AsyncWith)):
            a1, a2 = p1[k][1], p2[k][1]
            return _make(src, fn, stmt, [_arm_words(stmt, a1), _arm_words(stmt, a2)],
                         [True, True], [a1.startswith("handler"), a2.startswith("handler")])
    # the constructs one side entered that the other passed by (or left)
    for side, rest, other in ((0, p1[k:], l2), (1, p2[k:], l1)):
        wrapped = other is not END and after is not None and other <= after
        for stmt, arm in rest:
            if isinstance(stmt, (ast.With, ast.AsyncWith)) or stmt is fn:
                continue
            holds_after = after is not None and stmt.lineno <= after <= S.end(stmt)
            if holds_after and not isinstance(stmt, S.LOOPS):
                continue  # both entered it: the split is further in
            passed = other is END or other > S.end(stmt) or wrapped
            if not passed:
                continue
            if isinstance(stmt, S.LOOPS) and holds_after:
                # both were in the loop and one left it: a `break`, or fewer iterations
                return _left_loop(src, fn, stmt, side, after)
            # an `if` on the rank nested in this one split them, not this one (`if step %
            # 10 == 0:` then `if rank == 0:`: every rank is at the same step)
            stmt, arm = _inner_rank_guard(src, rest, stmt, arm)
            # `if c: ...; return` and an op after it in the same block are two arms
            other_arm = (other is not END and not wrapped and isinstance(stmt, ast.If)
                         and not stmt.orelse and arm == "body" and bool(S.exits_in(stmt.body))
                         and isinstance(stmt.body[-1], S.EXITS))
            return _make(src, fn, stmt, _pair(side, _arm_words(stmt, arm), "did not enter {b}"
                                              if isinstance(stmt, ast.If) and arm == "body"
                                              else "passed {b} by"),
                         _pair(side, True, other_arm),
                         # an `except` is a way out of the path every rank was on
                         _pair(side, arm.startswith("handler"), False))
    return None


def _inner_rank_guard(src, rest: list, stmt, arm) -> tuple:
    """(the innermost `if` of `rest` inside `stmt` whose own condition reads the rank,
    its arm), or (stmt, arm) where there is none or `stmt` itself reads it."""
    if isinstance(stmt, ast.If) and C.kind_of(src, stmt.test) == "rank":
        return stmt, arm
    inner = [(s, a) for s, a in rest if s is not stmt and isinstance(s, ast.If)
             and stmt.lineno < s.lineno <= S.end(stmt) and C.kind_of(src, s.test) == "rank"]
    return inner[-1] if inner else (stmt, arm)


def _left_loop(src, fn, loop, stayed: int, after, line: int | None = None) -> Branch:
    """Both sides ran `loop`; side `stayed` went round again (to `line`, where known), the
    other left it: by a `break`, by a `continue` that skipped the op at `line` in one
    iteration, or with fewer iterations."""
    brk = _break_in(src, fn, loop, after)
    if brk is not None:
        return _exit_branch(src, fn, *brk, 1 - stayed)
    skip = L.skip_in(fn, loop, line) if line is not None else None
    if skip is not None:  # one iteration fewer of the collective: a `continue` skipped it
        b = _make(src, fn, skip[0], _pair(stayed, "went through {b} every iteration",
                                          f"skipped an iteration (line {skip[1].lineno}) "
                                          f"under {{b}}"),
                  _pair(stayed, True, False), _pair(stayed, False, True))
        b.exit_line = skip[1].lineno
        return b
    return _make(src, fn, loop, _pair(stayed, "went round {b} again", "left {b}"),
                 _pair(stayed, True, False), _pair(stayed, False, True))


def _pair(side: int, mine, theirs) -> list:
    return [mine, theirs] if side == 0 else [theirs, mine]


def _break_in(src, fn, loop, after) -> tuple | None:
    """(the `if`, its `break`) in the loop's body that leaves the loop early, a branch
    on the rank's identity first."""
    found = [(ifs, ex) for ex, ifs, leaves in S.ways_out(fn, None, None)
             if isinstance(ex, ast.Break) and leaves is loop and ifs]
    if not found:
        return None
    found.sort(key=lambda f: (not _rank_guarded(src, fn, f[0][-1]), f[1].lineno))
    ifs, ex = found[0]
    return _guard_of(src, ifs), ex


def _guard_of(src, ifs: list) -> ast.If:
    """Of the `if`s around an exit (outermost first), the one to name: the innermost on
    the rank's identity, else the innermost."""
    ranked = [s for s in ifs if isinstance(s, ast.If) and C.kind_of(src, s.test) == "rank"]
    return (ranked or ifs)[-1]


_LEFT = {ast.Return: "returned early", ast.Raise: "raised", ast.Continue:
         "skipped to the next iteration", ast.Break: "broke out of the loop"}


def _exit_branch(src, fn, stmt: ast.If, ex: ast.AST, side: int) -> Branch:
    """`side` took the way out `ex` under `stmt`; the other side went on past it."""
    b = _make(src, fn, stmt, _pair(side, f"{_LEFT.get(type(ex), 'left')} (line "
                                         f"{ex.lineno}) under {{b}}", "went on past {b}"),
              _pair(side, False, True), _pair(side, True, False))
    b.exit_line = ex.lineno
    b.gate = _is_gate(src, fn, stmt, ex)
    return b


def _is_gate(src, fn, stmt: ast.If, ex: ast.AST) -> bool:
    """A gate, what follows it meant for the ranks it lets through (not a bail-out of
    common code): `if not is_main: return` among a function's first statements, or an
    `if` on the rank alone whose arm does nothing but leave (`if local_rank != 0:
    continue`, a log line at most). An exit deeper inside (r21: `if rank == 0:` ... `if
    patience ...: break`) or under a fault at one point (`if rank == 1 and step == 2:
    break`) is no gate: it is the guarded code."""
    if ex in stmt.body and not stmt.orelse and C.only_rank(src, stmt.test) and all(
            b is ex or isinstance(b, ast.Pass) or _said_only(b) for b in stmt.body):
        return True
    if not isinstance(ex, (ast.Return, ast.Raise)) or stmt not in getattr(fn, "body", []):
        return False
    before = fn.body[:fn.body.index(stmt)]
    simple = (ast.Assign, ast.AnnAssign, ast.Import, ast.ImportFrom, ast.Pass, ast.Global,
              ast.Nonlocal)
    return all(isinstance(b, simple) or (isinstance(b, ast.Expr)
                                         and isinstance(b.value, ast.Constant)) for b in before)


def _said_only(stmt: ast.AST) -> bool:
    """A docstring, a print or a log call: nothing an arm does (a collective would be)."""
    if not isinstance(stmt, ast.Expr):
        return False
    call = stmt.value
    if isinstance(call, ast.Constant):
        return True
    name = getattr(getattr(call, "func", None), "attr", None) or getattr(
        getattr(call, "func", None), "id", "")
    return isinstance(call, ast.Call) and name in _SAYING


_SAYING = {"print", "debug", "info", "warning", "warn", "error", "log", "write"}


def _other_arm_of_a_constant(src, fn, theirs, mine, loop) -> bool:
    """Whether the two paths part at an `if` whose condition is not the rank's and does
    not change in the loop both sides ran (`if mode == "eval":`): the side at `mine`
    took its arm, so the other side did too, and an exit in another arm was never on
    its way."""
    for (s1, a1), (s2, a2) in zip(theirs, mine, strict=False):
        if s1 is not s2:
            return False
        if a1 != a2:
            return (isinstance(s1, ast.If) and C.kind_of(src, s1.test) != "rank"
                    and loop is not None and L.invariant(s1, loop))
    return False


def way_out(src, fn, line, after, side: int) -> Branch | None:
    """The other side left the path to `line` (it went out of the function, or round
    the loop, or out of it): the first of the early exits between `after` and `line`
    and the `if`s holding `line` that `after` is not in, a branch on the rank's identity
    first."""
    cands = []  # (on the rank's identity, explains where the other went, line, ...)
    loop = L.holding(fn, line, after)
    mine = S.path_to(fn, line)
    for ex, ifs, _loop in S.ways_out(fn, after, line):
        if not ifs or _other_arm_of_a_constant(src, fn, S.path_to(fn, ex.lineno), mine, loop):
            continue  # an exit no branch guards (every rank takes it), or out of reach
        # (the `if`s around it are all conditions around its innermost one)
        cands.append((_rank_guarded(src, fn, ifs[-1]), True, ex.lineno, "exit",
                      _guard_of(src, ifs), ex))
    for stmt, arm in S.path_to(fn, line):
        if S.is_main_guard(stmt) or (loop is not None and L.invariant(stmt, loop)
                                     and C.kind_of(src, stmt.test) != "rank"):
            continue  # every rank runs the script as __main__; a condition the loop
            # does not change went the same way as in the iteration both ranks ran (but
            # one on the rank, under another met only now: `if step % 10 == 0:`)
        if isinstance(stmt, ast.Try) and arm == "body" and stmt.handlers and not (
                after is not None and stmt.lineno <= after <= S.end(stmt)):
            # a handler that leaves (or, in the loop both ran, falls through to the next
            # iteration) explains where the other side is
            out = any(S.exits_in(h.body) for h in stmt.handlers) or (
                loop is not None and S.end(stmt) <= S.end(loop))
            cands.append((False, out, stmt.lineno, "raised", stmt, stmt.handlers[0]))
        if isinstance(stmt, (ast.If,) + S.LOOPS) and not (
                after is not None and stmt.lineno <= after <= S.end(stmt)):
            cands.append((_rank_guarded(src, fn, stmt), False, stmt.lineno, "enter", stmt,
                          None))
    if not cands:
        return _feeding(src, fn, line, after, side)
    # a condition on the rank's identity says more than any other; else the first met
    cands.sort(key=lambda c: (not c[0], not c[1], c[2]))
    _, _, _, how, stmt, ex = cands[0]
    if how == "exit":
        return _exit_branch(src, fn, stmt, ex, 1 - side)
    if how == "raised":  # the other side raised in the `try` and took its handler
        b = _make(src, fn, stmt, _pair(side, "stayed in the try of {b}",
                                       f"raised and took the except at line {ex.lineno} of "
                                       f"{{b}}"),
                  _pair(side, True, False), _pair(side, False, True))
        b.exit_line = ex.lineno
        return b
    arm = next(a for s, a in S.path_to(fn, line) if s is stmt)
    return _make(src, fn, stmt, _pair(side, _arm_words(stmt, arm), "did not enter {b}"
                                      if isinstance(stmt, ast.If) else "passed {b} by"),
                 _pair(side, True, False), _pair(side, False, False))


def _feeding(src, fn, line, after, side: int) -> Branch | None:
    """An `if` before `line` (after line `after`) whose arm changes a name the statement
    at `line` reads: the ranks' paths did not split at the op, but what it sends did (a
    metric added to the dict a logging call syncs on one rank only)."""
    stmt_at = next((n for n in ast.walk(fn) if isinstance(n, ast.stmt)
                    and not isinstance(n, S.FUNCS) and n.lineno == line), None)
    if stmt_at is None:
        return None
    if after is not None and after >= line:  # the op before came from the same line
        after = None
    read = {n.id for n in ast.walk(stmt_at) if isinstance(n, ast.Name)}
    found = [n for n in ast.walk(fn) if isinstance(n, ast.If) and S.end(n) < line
             and (after is None or n.lineno > after)
             and (S.stored(n.body) | S.stored(n.orelse)) & read]
    if not found:
        return None
    stmt = max(found, key=lambda n: n.lineno)
    b = _make(src, fn, stmt, _pair(side, f"entered {{b}}, which changed what line {line} "
                                         f"sends,", "did not enter {b}"),
              _pair(side, True, False), _pair(side, False, False))
    b.feeds = True
    return b


def decorated(src, fn, side: int) -> Branch | None:
    dec = C.rank_decorator(fn)
    if dec is None:
        return None
    return Branch(src.path, dec.lineno, fn.name, "decorator", f"@{src.segment(dec)}", "rank",
                  _pair(side, f"ran {fn.name} under {{b}}", f"skipped {fn.name} under {{b}}"),
                  _pair(side, True, False), _pair(side, False, False))


