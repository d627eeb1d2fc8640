"""A function's loops, as branch reading needs them (arms.py): the loop one side left
while the other went round, the loop both sides ran an iteration of, whether a
condition changes in a loop, a `continue` that skips an iteration's op.
"""

from __future__ import annotations

import ast

from distdoctor.diagnosis.parting import source as S


def left(fn, l1, l2, after):
    """The loop that holds `after` and one side's line while the other side's line lies
    past its end: that side left the loop (fewer iterations, a `break`). Of nested such
    loops, the innermost that a `break` leaves, else the outermost: a side past the end
    of the batch loop left it, having finished the loop over the parameters inside it as
    every rank does."""
    if after is None or None in (l1, l2):  # a side gone from the function (END)
        return None
    for inside, outside in ((l1, l2), (l2, l1)):
        loops = [s for s, _ in S.path_to(fn, inside) if isinstance(s, S.LOOPS)
                 and s.lineno <= after <= S.end(s) and outside > S.end(s)]
        if loops:
            broken = {id(leaves) for ex, _, leaves in S.ways_out(fn, None, None)
                      if isinstance(ex, ast.Break)}
            return next((s for s in reversed(loops) if id(s) in broken), loops[0])
    return None


def holding(fn, line, after):
    """The innermost loop holding both `line` and `after` (both ranks ran its earlier
    iteration), else None."""
    if after is None:
        return None
    loops = [s for s, _ in S.path_to(fn, line) if isinstance(s, S.LOOPS)
             and s.lineno <= after <= S.end(s)]
    return loops[-1] if loops else None


def invariant(stmt, loop) -> bool:
    """An `if`/`while` whose condition calls nothing and reads no name the loop binds:
    it is the same in every iteration (`if mode == "eval":`)."""
    test = getattr(stmt, "test", None)
    if not isinstance(stmt, (ast.If, ast.While)) or test is None:
        return False
    if any(isinstance(n, (ast.Call, ast.Attribute, ast.Subscript)) for n in ast.walk(test)):
        return False
    names = {n.id for n in ast.walk(test) if isinstance(n, ast.Name)}
    target = getattr(loop, "target", None)  # a `for` binds its target every iteration
    bound = S.stored(loop.body) | ({n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
                                   if target is not None else set())
    return not names & bound


def skip_in(fn, loop, line) -> tuple | None:
    """(the `if` or `try` whose arm holds it, the `continue`) of `loop`, or of a loop in
    it, before `line`, the op the staying side is at: a way to skip that op in one
    iteration."""
    for stmt in ast.walk(loop):
        if stmt is loop or not isinstance(stmt, (ast.If, ast.Try)) or stmt.lineno >= line:
            continue
        blocks = ([stmt.body, stmt.orelse] if isinstance(stmt, ast.If)
                  else [h.body for h in stmt.handlers])
        for block in blocks:
            cont = next((e for e in S.exits_in(block, loop_exits=True)
                         if isinstance(e, ast.Continue)), None)
            if cont is not None and _skips(fn, loop, _innermost(fn, cont), line):
                return stmt, cont
    return None


def _skips(fn, loop, inner, line) -> bool:
    """Whether a `continue` whose innermost loop is `inner` skips the op at `line` in
    `loop`: `inner` is the loop, or a loop in it that holds the line (a batch loop in an
    epoch loop: the rank that skipped a batch is seen only when the epochs end)."""
    return inner is loop or (inner is not None and loop.lineno < inner.lineno
                             and inner.lineno <= line <= S.end(inner) <= S.end(loop))


def _innermost(fn, node):
    loops = [s for s, _ in S.path_to(fn, node.lineno) if isinstance(s, S.LOOPS)]
    return loops[-1] if loops else None
