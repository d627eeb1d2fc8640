"""The user's source, read with `ast` after a failure: the statements around a line.

Step 2 of where-the-ranks-parted (align.py, branch.py, blame.py, parted.py) reads the
program, never the hot path: a file is read and parsed once per diagnosing process and
run (cached), and only for the lines a failure's call sites name: the copy the run kept
of it (runlog/kept.py), so an edit after the run, or another machine, changes nothing. A
file that cannot be read or parsed (gone, changed with no copy kept, not Python, a
notebook cell) is None, and the callers say so.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import lru_cache

from distdoctor.privatefiles import read_bounded

# statements that leave the current path early: the arm of an `if` that holds one is a
# way out that the other ranks' path did not take
EXITS = (ast.Return, ast.Raise, ast.Continue, ast.Break)
LOOPS = (ast.For, ast.AsyncFor, ast.While)
FUNCS = (ast.FunctionDef, ast.AsyncFunctionDef)
# A source read from the disk (a run that kept none): larger is no program to parse here
# (the kept copies' bound is 1 MiB: runlog/sources.py)
MAX_SOURCE_BYTES = 16 << 20


@dataclass(frozen=True)
class Source:
    path: str
    text: str
    tree: ast.Module

    def segment(self, node: ast.AST, limit: int = 120) -> str:
        """The node's source text on one line ('?' where it cannot be had)."""
        text = ast.get_source_segment(self.text, node) or "?"
        text = " ".join(text.split())
        return text if len(text) <= limit else text[:limit - 3] + "..."


def read(path: str | None) -> Source | None:
    """The parsed file as the run saw it; None when it cannot be read or parsed. The copy
    the run kept is read where there is one; else the file on disk, only when its hash
    is the one the run recorded (runlog/kept.py: it says once when a file changed). A run
    that recorded nothing of the file (an older run dir) reads the disk."""
    if not path or path.startswith("<"):
        return None
    from distdoctor.runlog.kept import current

    return _read(path, current())


read.cache_clear = lambda: _read.cache_clear()  # (tests that write files in place)


@lru_cache(maxsize=64)
def _read(path: str, kept) -> Source | None:
    try:
        decided, text = kept.text(path) if kept is not None else (False, None)
        if not decided:
            # a path the log names, read only as a regular file within bounds: a FIFO or
            # /dev/zero there is refused, never waited on nor read for ever
            text = read_bounded(path, MAX_SOURCE_BYTES, follow=True).decode()
        return None if text is None else Source(path, text, ast.parse(text))
    except (OSError, SyntaxError, ValueError, TypeError, MemoryError, RecursionError):
        return None


def end(node: ast.AST) -> int:
    return getattr(node, "end_lineno", None) or node.lineno


def spans(stmts, line: int) -> bool:
    """Whether `line` lies in the block of statements."""
    return bool(stmts) and stmts[0].lineno <= line <= max(end(s) for s in stmts)


def function_at(src: Source, name: str | None, line: int) -> ast.AST:
    """The innermost function (def) holding `line` whose name is the last part of
    `name` (a qualified name: 'Trainer.train'), else the innermost def holding it, else
    the module."""
    short = (name or "").rsplit(".", 1)[-1]
    best = best_named = None
    for node in ast.walk(src.tree):
        if isinstance(node, FUNCS) and node.lineno <= line <= end(node):
            if best is None or node.lineno >= best.lineno:
                best = node
            if node.name == short and (best_named is None or node.lineno >= best_named.lineno):
                best_named = node
    if short == "<module>":
        return src.tree
    return best_named or best or src.tree


def arms(stmt: ast.AST) -> list[tuple[str, list]]:
    """A compound statement's blocks, each named: an `if`'s body and else, a loop's body
    (and else), a `try`'s body and handlers, a `match`'s cases, a `with`'s body."""
    if isinstance(stmt, ast.If):
        return [("body", stmt.body), ("else", stmt.orelse)]
    if isinstance(stmt, LOOPS):
        return [("body", stmt.body), ("else", stmt.orelse)]
    if isinstance(stmt, ast.Try) or type(stmt).__name__ == "TryStar":
        return ([("body", stmt.body + stmt.orelse)]
                + [(f"handler {i}", h.body) for i, h in enumerate(stmt.handlers)]
                + [("finally", stmt.finalbody)])
    if type(stmt).__name__ == "Match":
        return [(f"case {i}", c.body) for i, c in enumerate(stmt.cases)]
    if isinstance(stmt, (ast.With, ast.AsyncWith)):
        return [("body", stmt.body)]
    return []


def is_main_guard(stmt: ast.AST) -> bool:
    """`if __name__ == "__main__":`"""
    return isinstance(stmt, ast.If) and "__name__" in {
        n.id for n in ast.walk(stmt.test) if isinstance(n, ast.Name)}


def path_to(fn: ast.AST, line: int) -> list[tuple[ast.AST, str]]:
    """The compound statements of `fn` (not of the defs nested in it) that hold `line`,
    outermost first, each with the name of the arm that holds it."""
    out, block = [], getattr(fn, "body", [])
    while True:
        stmt = next((s for s in block if s.lineno <= line <= end(s)), None)
        if stmt is None or isinstance(stmt, FUNCS + (ast.ClassDef,)):
            return out
        found = next(((name, b) for name, b in arms(stmt) if spans(b, line)), None)
        if found is None:
            return out
        out.append((stmt, found[0]))
        block = found[1]


def exits_in(block, loop_exits: bool = True) -> list[ast.AST]:
    """The exit statements in a block, not those of defs nested in it, nor a `break` or
    `continue` of a loop nested in it."""
    out = []
    for stmt in block:
        if isinstance(stmt, EXITS):
            if loop_exits or isinstance(stmt, (ast.Return, ast.Raise)):
                out.append(stmt)
        elif not isinstance(stmt, FUNCS + (ast.ClassDef,)):
            for _, b in arms(stmt):
                out += exits_in(b, loop_exits and not isinstance(stmt, LOOPS))
    return out


def ways_out(fn: ast.AST, after: int | None, before: int | None) -> list[tuple]:
    """The early exits of `fn` a rank could have taken after line `after` (None: from
    the start) instead of reaching line `before` (None: anywhere): a `return` or
    `raise`, or a `break`/`continue` of a loop that holds `before`. A `before` at or
    above `after` is a loop come round: any line of it. Each as (the exit, the `if`
    statements around it in `fn`, outermost first, the loop it leaves or None)."""
    out = []
    wrapped = after is not None and before is not None and before <= after

    def visit(block, ifs, loops, in_try):
        for stmt in block:
            if isinstance(stmt, FUNCS + (ast.ClassDef,)):
                continue
            line = stmt.lineno
            if isinstance(stmt, EXITS):
                loop = loops[-1] if loops else None
                in_range = wrapped or ((after is None or line > after)
                                       and (before is None or line < before))
                leaves = isinstance(stmt, (ast.Return, ast.Raise)) or (
                    loop is not None and (before is None or loop.lineno <= before <= end(loop)))
                if in_range and leaves and not (in_try and isinstance(stmt, ast.Raise)):
                    out.append((stmt, list(ifs), loop))
                continue
            for name, b in arms(stmt):
                if name == "body" and isinstance(stmt, ast.Try) and stmt.handlers:
                    # a `raise` in a `try` lands in its handler: not a way out
                    b = [x for x in b if not isinstance(x, ast.Raise)]
                    caught = True
                else:
                    caught = False
                visit(b, ifs + [stmt] if isinstance(stmt, ast.If) else ifs,
                      loops + [stmt] if isinstance(stmt, LOOPS) else loops,
                      in_try or caught)

    visit(getattr(fn, "body", []), [], [], False)
    return out


CHANGES = {"update", "append", "extend", "setdefault", "insert", "add", "pop"}


def stored(block) -> set[str]:
    """Names a block binds or changes: `x = ...`, `d[k] = ...`, `d.update(...)`."""
    out = set()
    for node in (n for stmt in block for n in ast.walk(stmt)):
        if isinstance(node, (ast.Name, ast.Attribute, ast.Subscript)) and isinstance(
                getattr(node, "ctx", None), ast.Store):
            while isinstance(node, (ast.Subscript, ast.Attribute)):
                node = node.value
            if isinstance(node, ast.Name):
                out.add(node.id)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                isinstance(node.func.value, ast.Name) and node.func.attr in CHANGES:
            out.add(node.func.value.id)
    return out
