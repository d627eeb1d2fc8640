"""The branch followed into the function its condition calls (with branch.py).

`if should_sync(lr):` around a collective splits the ranks, but what split them is inside
`should_sync`: an early `return False` under `if lr < 0.1:`, taken on the rank whose float
was one ulp under. The caller's `if` only passes on the answer. Where the branch's
condition is a call of a function of the same file (`f(...)`, `not f(...)`), and that
function has early returns under an `if` whose value would send a rank past the caller's
arm (falsy where the caller asks `if f(...)`, truthy under `not`), the innermost guard of
the first such return is the branch; the caller's line is kept in the words.
"""

from __future__ import annotations

import ast

from distdoctor.diagnosis.parting import conditions as C
from distdoctor.diagnosis.parting import source as S
from distdoctor.diagnosis.parting.arms import Branch


def into_callee(b: Branch) -> Branch:
    """`b`, or the guard inside the function its condition calls that split the ranks."""
    if b.statement != "if" or b.exit_line is not None or sorted(b.inside) != [False, True]:
        return b
    src = S.read(b.file)
    node = next((n for n in ast.walk(src.tree) if isinstance(n, ast.If)
                 and n.lineno == b.line), None) if src is not None else None
    if node is None:
        return b
    test, negated = node.test, False
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        test, negated = test.operand, True
    if not (isinstance(test, ast.Call) and isinstance(test.func, ast.Name)):
        return b
    callee = next((f for f in src.tree.body if isinstance(f, S.FUNCS)
                   and f.name == test.func.id), None)
    if callee is None:
        return b
    # the returns that keep a rank out of the caller's arm
    exits = [(ex, ifs) for ex, ifs, _ in S.ways_out(callee, None, None)
             if isinstance(ex, ast.Return) and ifs and _truthy(ex.value) is negated]
    if not exits:
        return b
    ex, ifs = exits[0]
    guard = ifs[-1]
    ranked = [s for s in ifs if C.kind_of(src, s.test) == "rank"]
    guard = ranked[-1] if ranked else guard
    out_side = b.inside.index(False)
    caller = f"`{b.condition}` (line {b.line})"
    did = ["", ""]
    did[out_side] = (f"returned early (line {ex.lineno}) under {{b}} in {callee.name}, so "
                     f"did not enter {caller}")
    did[1 - out_side] = f"went on past {{b}} in {callee.name} and entered {caller}"
    kind = "rank" if C.kind_of(src, guard.test) == "rank" or b.kind == "rank" else "data"
    out = Branch(b.file, guard.lineno, callee.name, "if", f"if {src.segment(guard.test)}:",
                 kind, did, list(b.inside), [not i for i in b.inside])
    out.exit_line = ex.lineno
    return out


def _truthy(value: ast.AST | None) -> bool | None:
    """What a `return` hands back, where a constant says it: False for a bare return,
    None, False, 0, ""; True for other constants; None (unknown) otherwise."""
    if value is None:
        return False
    if isinstance(value, ast.Constant):
        return bool(value.value)
    return None
