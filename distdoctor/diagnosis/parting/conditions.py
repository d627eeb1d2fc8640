"""What a branch's condition is about: the rank's identity, or the rank's data.

`if rank == 0:` says the code under it is meant for some ranks only; `if loss.isnan():`
says the ranks' data sent them different ways. The difference decides who strayed
(blame.py), so it is read from the program, not guessed from the ops: a condition is on
the rank's identity when it reads the rank (`rank`, `get_rank()`, `RANK`/`LOCAL_RANK`
from the environment, the frameworks' `is_main_process`, `is_global_zero`,
`is_world_process_zero`, `master_process`, a pipeline stage's `is_last_stage`...), or a
name the same function or module bound from such an expression, or a function of the
file that returns one. Everything else is data.
"""

from __future__ import annotations

import ast
import re
from functools import lru_cache

from distdoctor.diagnosis.parting.source import FUNCS, Source

# names that say "which rank am I" in the frameworks and in training scripts
_RANK_WORDS = {
    "is_main_process", "is_local_main_process", "is_global_zero", "is_local_zero",
    "is_world_process_zero", "is_local_process_zero", "master_process", "is_master",
    "is_main", "is_rank_zero", "is_rank0", "is_master_ordinal", "process_index",
    "local_process_index", "is_first_stage", "is_last_stage", "is_pipeline_first_stage",
    "is_pipeline_last_stage", "is_chief", "is_leader", "main_process", "is_root",
    "rank_zero", "global_zero", "is_coordinator",
}
# `rank`, `local_rank`, `ddp_rank`, `self._rank`, `pp_rank`, `rank_id`... but not a
# LoRA rank or a ranking
_RANK_NAME = re.compile(r"(?:[a-z0-9]+_)*rank(?:_?(?:id|idx|index|num|no))?")
_NOT_RANK = re.compile(r"lora|ranking|low_rank|rank_loss|ranker|rank_k|rank_r\b")
# environment variables a launcher sets to the rank
_RANK_ENV = {"RANK", "LOCAL_RANK", "GROUP_RANK", "NODE_RANK", "SLURM_PROCID",
             "SLURM_LOCALID", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
             "PMI_RANK", "PMIX_RANK", "MV2_COMM_WORLD_RANK"}
# decorators that run a function on some ranks only
RANK_DECORATORS = {"rank_zero_only", "main_process_only", "on_main_process",
                   "on_local_main_process", "on_process", "on_local_process",
                   "on_last_process", "rank_zero_first", "master_only", "main_only"}


def is_rank_word(name: str) -> bool:
    low = name.lstrip("_").lower()
    if low in _RANK_WORDS:
        return True
    return bool(_RANK_NAME.fullmatch(low)) and not _NOT_RANK.search(low)


# calls that pass the rank on: int(os.environ["RANK"]), os.getenv("LOCAL_RANK", 0)
_PASS_ON = {"int", "bool", "getenv", "get", "environ", "str"}


def _reads_rank(node: ast.AST, bound: frozenset) -> bool:
    """Whether the expression is the rank's identity or a test of it: a rank's name, a
    call that returns it, the launcher's variable, a comparison or a boolean of those.
    Not a value computed from it (a path with the rank in it is data)."""
    if isinstance(node, ast.Name):
        return is_rank_word(node.id) or node.id in bound
    if isinstance(node, ast.Attribute):
        return is_rank_word(node.attr) or node.attr in bound
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str) and node.value in _RANK_ENV
    if isinstance(node, ast.Call):
        if _reads_rank(node.func, bound):
            return True
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(
            node.func, "id", "")
        return name in _PASS_ON and any(_reads_rank(a, bound) for a in node.args)
    if isinstance(node, ast.Subscript):  # os.environ["RANK"]
        return _reads_rank(node.slice, bound)
    if isinstance(node, ast.Compare):
        return any(_reads_rank(x, bound) for x in [node.left, *node.comparators])
    if isinstance(node, ast.BoolOp):
        return any(_reads_rank(v, bound) for v in node.values)
    if isinstance(node, ast.UnaryOp):
        return _reads_rank(node.operand, bound)
    if isinstance(node, ast.BinOp):  # rank % 2, rank // per_node
        return _reads_rank(node.left, bound) or _reads_rank(node.right, bound)
    return False


@lru_cache(maxsize=64)
def _bound_from_rank(src: Source) -> frozenset:
    """Names and attributes the file binds from the rank's identity (`master_process =
    ddp_rank == 0`, `self.is_zero = dist.get_rank() == 0`), and functions of the file
    that return it (`def is_main(): return get_rank() == 0`): to a fixed point."""
    bound: set[str] = set()
    assigns, returns = [], []
    for node in ast.walk(src.tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and node.value:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [t.id if isinstance(t, ast.Name) else t.attr for tgt in targets
                     for t in ast.walk(tgt) if isinstance(t, (ast.Name, ast.Attribute))
                     and isinstance(getattr(t, "ctx", None), ast.Store)]
            assigns.append((names, node.value))
        elif isinstance(node, FUNCS):
            rets = [r.value for r in ast.walk(node) if isinstance(r, ast.Return) and r.value]
            if rets and len(node.body) <= 8:  # a small predicate, not a whole program
                returns.append((node.name, rets))
    changed = True
    while changed:
        changed = False
        frozen = frozenset(bound)
        for names, value in assigns:
            if any(n not in bound for n in names) and _reads_rank(value, frozen):
                bound.update(names)
                changed = True
        for name, rets in returns:
            if name not in bound and all(_reads_rank(r, frozen) for r in rets):
                bound.add(name)
                changed = True
    return frozenset(bound)


def kind_of(src: Source, test: ast.AST | None) -> str:
    """'rank' when the condition reads the rank's identity, else 'data'."""
    if test is None:
        return "data"
    return "rank" if _reads_rank(test, _bound_from_rank(src)) else "data"


def only_rank(src: Source, test: ast.AST) -> bool:
    """Whether every term of the condition reads the rank's identity (`local_rank != 0`,
    `not is_main`), unlike a fault injected at one point (`rank == 1 and step == 2`)."""
    if isinstance(test, ast.BoolOp):
        return all(only_rank(src, v) for v in test.values)
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return only_rank(src, test.operand)
    return _reads_rank(test, _bound_from_rank(src))


def rank_decorator(fn: ast.AST) -> ast.AST | None:
    """The decorator that runs the function on some ranks only (`@rank_zero_only`)."""
    for dec in getattr(fn, "decorator_list", ()):
        target = dec.func if isinstance(dec, ast.Call) else dec
        name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", "")
        if name in RANK_DECORATORS:
            return dec
    return None
