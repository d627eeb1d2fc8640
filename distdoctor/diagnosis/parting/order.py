"""The same collectives in a different order: a loop whose items each rank walks in its
own order.

Where the two sides' ops at the parting come from the same line and callers but differ
(sizes, dtypes), no rank strayed from the program: one line issued different
collectives. When that line lies in a loop, the loop visited its items in a different
order (or different items) on the ranks: iterating a `set` (string hashing is salted
per process), a dict built from one, a directory listing. The order is the finding, not
a culprit. Read from the source (source.py), like the branch (branch.py).

It is said only with a reason to think so: the loop walks something unordered, or each
side's op at the parting is one the other side also issued from that line (the same
items, met in another order). A `for step in range(n):` whose all_reduce sends float16
on one rank and float32 on the others walks the same steps everywhere: one rank built
its tensor differently, which the plain mismatch says.
"""

from __future__ import annotations

import ast
import os

from distdoctor.diagnosis.parting import align as D
from distdoctor.diagnosis.parting import branch as B
from distdoctor.diagnosis.parting import source as S

# iterables whose order is not the same in every process
_UNORDERED = ("set(", "frozenset(", "{", ".keys()", "listdir(", "glob(", "iterdir(",
              "scandir(", ".values()", ".items()")


def _met_elsewhere(p: D.Parting, pools) -> bool:
    """Whether each side's op at the parting is one the other side issued from that line
    too (same signature, another seq): the same items, met in another order. One way is
    not enough: a rank that sends float16 from step 2 on issued the others' float32 op
    in steps 0-1."""
    def seen(ev, pool):
        return any(e is not ev and e.kind == "collective" and e.group == ev.group
                   and D.site(e) == D.site(ev) and D.signature(e) == D.signature(ev)
                   for e in pool)
    return seen(p.ours, pools[1]) and seen(p.theirs, pools[0])


def loop_of(p: D.Parting, pools=((), ())) -> dict | None:
    """The loop that issued the two sides' differing ops from one line, as details; None
    when the ops come from different lines, no loop holds the line, or nothing says its
    order differed (the module doc). `pools`: side a's and side b's events."""
    if p.how != "differ" or p.ours is None or p.theirs is None:
        return None
    if D.site(p.ours) != D.site(p.theirs):
        return None
    met = _met_elsewhere(p, pools)
    for file, func, line in reversed(B.chain(p.ours)):
        src = S.read(file)
        if src is None or line is None:
            continue
        fn = S.function_at(src, func, line)
        loops = [s for s, arm in S.path_to(fn, line)
                 if isinstance(s, S.LOOPS) and arm == "body"]
        if not loops:
            continue
        loop = loops[-1]
        head = (f"for {src.segment(loop.target)} in {src.segment(loop.iter)}:"
                if isinstance(loop, (ast.For, ast.AsyncFor)) else f"while {src.segment(loop.test)}:")
        over = src.segment(getattr(loop, "iter", loop))
        unordered = any(u in over for u in _UNORDERED) or "set" in over.lower()
        if not (unordered or met):
            return None
        return {"file": file, "line": loop.lineno, "loop": head,
                "unordered": unordered,
                "where": f"{os.path.basename(file)}:{loop.lineno}"}
    return None


def sentence(order: dict, a: int, b: int, p: D.Parting) -> str:
    why = ("it iterates something whose order differs between processes (a set: string "
           "hashing is salted per process; use sorted(...))" if order["unordered"] else
           "each rank walks its items in another order, or other items")
    return (f"ranks {a} and {b} issue the collectives of one loop in a different order: "
            f"`{order['loop']}` ({order['where']}) made rank {a} issue "
            f"{D.describe(p.ours)} where rank {b} issued {D.describe(p.theirs)}, the same "
            f"line; {why}")
