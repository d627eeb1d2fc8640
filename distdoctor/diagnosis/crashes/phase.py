"""The phase of a crash: the step it came in, before the first step, or after the last.

A rank that raised is said with where it was in the job's steps: "in step 40" (one rank
of four raising mid-loop), "after the last step (step 20)" (an exception in the
evaluation after the loop ended, where the step span left open by the last step would
say "in step 20"), "before the first step". Read from the program (source.py): the loop
that holds the rank's collectives, in the function where it raised, and whether the line
that raised lies in that loop, after it or before it. The step is the job's own span
where it has one (its framework's count); else the turns of that loop the rank made,
counted from its ops at the loop's line, numbered as the loop's `range(start, ...)`
numbers them. None where the program does not tell (another file, no loop).
"""

from __future__ import annotations

import ast

from distdoctor.diagnosis.parting import source as S
from distdoctor.diagnosis.parting.branch import chain


def crash_phase(ended_at: dict, history, span: str | None) -> dict | None:
    """{"phase": "in_step" | "after_last_step" | "before_first_step", "step": its label
    or None, "text": the words} for a rank that ended at `ended_at` ({file, line,
    function}), its recent ops `history` (oldest first), in `span` (or None)."""
    file, line = ended_at.get("file"), ended_at.get("line")
    src = S.read(file) if file and isinstance(line, int) else None
    if src is None:
        return None
    fn = S.function_at(src, ended_at.get("function"), line)
    memo: dict = {}  # a few distinct frames among the ops: one reading of each
    lines = [at for ev in history if ev.kind in ("collective", "p2p")
             and (at := _line_in(ev, src, fn, memo)) is not None]
    if not lines:
        return None
    site = max(set(lines), key=lambda x: (lines.count(x), -x))  # the loop's own op
    loops = [s for s, _ in S.path_to(fn, site) if isinstance(s, S.LOOPS)]
    if not loops:
        return None
    holding = [s for s in loops if s.lineno <= line <= S.end(s)]
    # the whole history is known (not cut at its bound): its ops count the turns
    whole = getattr(history, "maxlen", None) is None or len(history) < history.maxlen
    turns = lines.count(site) if whole else None
    if holding:
        loop = holding[-1]
        # a line before the op in the loop's body: this turn had not reached the op yet
        turn = None if turns is None else turns + (1 if line < site else 0)
        step = span or _label(loop, turn)
        return {"phase": "in_step", "step": step,
                "text": f"in {step}" if step else f"in the loop at line {loop.lineno}"}
    loop = loops[0]
    if line > S.end(loop):
        step = span or _label(loop, turns)
        return {"phase": "after_last_step", "step": step,
                "text": f"after the last step ({step})" if step else
                f"after the loop at line {loop.lineno}"}
    if line < loop.lineno and turns == 0:
        return {"phase": "before_first_step", "step": None, "text": "before the first step"}
    return None


def _line_in(ev, src, fn, memo: dict) -> int | None:
    """The line of `fn` the op came from: its own line there, or the call in `fn` that
    led to it (the frames the tracer kept)."""
    for file, function, line in chain(ev):
        if file != src.path or not isinstance(line, int):
            continue
        key = (function, line)
        if key not in memo:
            memo[key] = S.function_at(src, function, line) is fn
        if memo[key]:
            return line
    return None


def _label(loop: ast.AST, turn: int | None) -> str | None:
    """'step 12': the turn's number as the loop counts it (`for step in range(1, n)`
    starts at 1, `range(n)` at 0), from 1 where the loop does not say."""
    if turn is None or turn < 1:
        return None
    start = 1
    it = getattr(loop, "iter", None)
    if (isinstance(it, ast.Call) and isinstance(it.func, ast.Name) and it.func.id == "range"
            and it.args):
        first = it.args[0] if len(it.args) > 1 else ast.Constant(0)
        if isinstance(first, ast.Constant) and isinstance(first.value, int):
            start = first.value
    return f"step {start + turn - 1}"
