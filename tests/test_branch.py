"""The branch that split the ranks, read from the program (issue 41): branch.py finds the
statement where two ranks' paths went different ways from the frames the tracer keeps,
conditions.py says whether it is on the rank's identity or on data, blame.py who strayed.
Unit tests on small sources written to a temporary folder and events built by hand; the
real jobs are in test_parted.py and test_branch_jobs.py."""

from __future__ import annotations

import textwrap

import pytest

from distdoctor.diagnosis.parting import align as D
from distdoctor.diagnosis.parting import blame
from distdoctor.diagnosis.parting import branch as B
from distdoctor.diagnosis.parting import conditions as C
from distdoctor.diagnosis.parting import source as S
from distdoctor.runlog.reader import Event


def _src(tmp_path, text: str, name="train.py") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    S.read.cache_clear()
    return str(path)


def _line(path: str, marker: str) -> int:
    for n, text in enumerate(open(path).read().splitlines(), 1):
        if marker in text:
            return n
    raise AssertionError(marker)


def _ev(rank, seq, op, path, frames) -> Event:
    """An op at the innermost of `frames` ((function, marker) outermost first)."""
    lines = [(fn, _line(path, m)) for fn, m in frames]
    fn, line = lines[-1]
    callers = [{"file": path, "line": ln, "function": f} for f, ln in reversed(lines[:-1])]
    return Event(rank=rank, index=seq, kind="collective", op=op, status="ok", group="0",
                 group_desc="", group_ranks=(0, 1), seq=seq, peer=None, shapes=((4,),),
                 dtypes=("float32",), device="cpu", numel_in=4, numel_out=4,
                 reduce_op="sum" if op == "all_reduce" else None,
                 callsite={"file": path, "line": line, "function": fn, "callers": callers},
                 t_enter_ns=seq, t_end_ns=seq + 1, span_index=0, name=None, error=None,
                 is_async=False, other_thread=False)


BUGGY = """
import torch.distributed as dist

def buggy(x, rank):
    dist.all_reduce(x)  # first
    if rank == 0:  # guard
        dist.all_reduce(x)  # extra

def main():
    rank = dist.get_rank()
    buggy(x, rank)  # call
    dist.barrier()  # barrier

main()  # module
"""


def test_a_rank_guard_in_a_helper_is_found_below_the_line_that_called_it(tmp_path):
    path = _src(tmp_path, BUGGY)
    before = _ev(0, 0, "all_reduce", path, [("<module>", "# module"), ("main", "# call"),
                                            ("buggy", "# first")])
    extra = _ev(0, 1, "all_reduce", path, [("<module>", "# module"), ("main", "# call"),
                                           ("buggy", "# extra")])
    barrier = _ev(1, 1, "barrier", path, [("<module>", "# module"), ("main", "# barrier")])
    br = B.find(before, extra, barrier)
    assert (br.line, br.kind, br.condition) == (_line(path, "# guard"), "rank", "if rank == 0:")
    assert br.inside == [True, False] and br.left == [False, False]
    assert br.said(0, "it") == "entered it" and br.said(1, "it") == "did not enter it"
    p = D.Parting("extra", extra, None, before, None, barrier)
    verdict = blame.judge(p, 0, 1, {0: [before, extra], 1: [before, barrier]}, majority=False)
    assert verdict.side == 0, verdict.why  # the rank that issued what was meant for it alone


@pytest.mark.parametrize("cond,kind", [
    ("rank == 0", "rank"), ("dist.get_rank() == 0", "rank"), ("master_process", "rank"),
    ("self.trainer.is_global_zero and not self.trainer.sanity_checking", "rank"),
    ("state.is_world_process_zero", "rank"), ("accelerator.is_main_process", "rank"),
    ("int(os.environ['LOCAL_RANK']) == 0", "rank"), ("is_zero", "rank"),
    ("leader()", "rank"), ("i % every == 0 and master_process", "rank"),
    ("os.path.exists(path)", "data"), ("loss.isnan()", "data"), ("batch is None", "data"),
    ("lora_rank > 0", "data"), ("len(metrics) == 0", "data"), ("cache_dir", "data"),
])
def test_a_condition_is_on_the_rank_or_on_data(tmp_path, cond, kind):
    path = _src(tmp_path, f"""
        import os
        import torch.distributed as dist
        is_zero = dist.get_rank() == 0
        cache_dir = os.path.join("/tmp", f"node{{dist.get_rank()}}")

        def leader():
            return int(os.environ["RANK"]) == 0

        if {cond}:
            pass
        """)
    src = S.read(path)
    test = next(n for n in src.tree.body if hasattr(n, "test")).test
    assert C.kind_of(src, test) == kind


def _two_sides(tmp_path, text, a, b, before=None, fn_a="f", fn_b="f"):
    path = _src(tmp_path, text)
    evs = [None if m is None else _ev(r, 5, "all_reduce", path,
                                      [("<module>", "# call"), (fn, m)])
           for r, m, fn in ((0, a, fn_a), (1, b, fn_b))]
    prev = None if before is None else _ev(0, 4, "all_reduce", path,
                                           [("<module>", "# call"), ("f", before)])
    return path, B.find(prev, evs[0], evs[1])


def test_an_early_return_on_data_is_the_way_out_the_other_side_took(tmp_path):
    path, br = _two_sides(tmp_path, """
        def f(loss):
            dist.all_reduce(loss)  # before
            if loss.isnan():  # guard
                return None
            dist.all_gather(out, loss)  # gather

        f(loss)  # call
        """, "# gather", None, before="# before")
    assert br.line == _line(path, "# guard") and br.kind == "data"
    assert br.left == [False, True] and "returned early" in br.said(1)


def test_a_break_under_a_rank_guard_names_the_guard(tmp_path):
    path, br = _two_sides(tmp_path, """
        def f(rank):
            while True:
                dist.all_reduce(x)  # before
                if rank == 0:  # guard
                    if patience_out():
                        break
                dist.barrier()  # barrier
            return x

        f(rank)  # call
        """, "# barrier", None, before="# before")
    assert br.line == _line(path, "# guard") and br.kind == "rank"
    assert br.left == [False, True] and "broke out" in br.said(1)
    assert not br.gate  # the break is the guarded code, not a gate before code for rank 0


def test_an_if_that_only_leaves_on_some_ranks_is_a_gate_for_the_rest(tmp_path):
    """`if local_rank != 0: continue` mid-loop: what follows is meant for rank 0 alone, so
    its collective is the stray one (the side that went on past is the culprit)."""
    path, br = _two_sides(tmp_path, """
        def f(local_rank):
            for step in range(4):
                dist.all_reduce(x)  # before
                if local_rank != 0:  # guard
                    print("not the main process")
                    continue
                dist.all_reduce(stats)  # stats

        f(local_rank)  # call
        """, "# stats", None, before="# before")
    assert br.line == _line(path, "# guard") and br.kind == "rank" and br.gate
    assert br.left == [False, True] and "skipped to the next iteration" in br.said(1)


def test_an_except_arm_is_the_side_whose_exception_sent_it_there(tmp_path):
    path, br = _two_sides(tmp_path, """
        def f():
            try:
                y = step()
                dist.all_reduce(y)  # body
            except ValueError:
                dist.barrier()  # handler

        f()  # call
        """, "# body", "# handler")
    assert br.statement == "try" and br.kind == "exception"
    assert br.left == [False, True] and "except" in br.said(1)


def test_two_arms_that_both_issue_are_a_tie_naming_the_branch(tmp_path):
    path, br = _two_sides(tmp_path, """
        def f():
            if os.path.exists(path):  # guard
                dist.broadcast(size, 0)  # a
                return size
            dist.all_gather(sizes, size)  # b

        f()  # call
        """, "# a", "# b")
    assert br.line == _line(path, "# guard") and br.inside == [True, True]


def test_the_outer_data_branch_is_named_before_the_one_inside_it(tmp_path):
    path, br = _two_sides(tmp_path, """
        def f():
            dist.all_reduce(x)  # before
            if state_path.exists():  # guard
                state = load(state_path)
                if dist.is_initialized():
                    dist.broadcast_object_list([state], src=0)  # op
                return state
            return None

        f()  # call
        """, "# op", None, before="# before")
    assert br.line == _line(path, "# guard") and br.inside == [True, False]


def test_a_rank_only_decorator_is_the_branch(tmp_path):
    path = _src(tmp_path, """
        @rank_zero_only
        def report(x):
            dist.all_reduce(x)  # op

        def main():
            dist.all_reduce(x)  # before
            report(x)  # call
            dist.barrier()  # barrier

        main()  # module
        """)
    before = _ev(0, 0, "all_reduce", path, [("<module>", "# module"), ("main", "# before")])
    op = _ev(0, 1, "all_reduce", path, [("<module>", "# module"), ("main", "# call"),
                                        ("report", "# op")])
    barrier = _ev(1, 1, "barrier", path, [("<module>", "# module"), ("main", "# barrier")])
    br = B.find(before, op, barrier)
    assert br.statement == "decorator" and br.kind == "rank" and br.inside == [True, False]


def test_an_unreadable_source_is_said_not_guessed(tmp_path):
    path = _src(tmp_path, BUGGY)
    extra = _ev(0, 1, "all_reduce", path, [("<module>", "# module"), ("main", "# call"),
                                           ("buggy", "# extra")])
    barrier = _ev(1, 1, "barrier", path, [("<module>", "# module"), ("main", "# barrier")])
    (tmp_path / "train.py").unlink()
    S.read.cache_clear()
    with pytest.raises(B.Unreadable):
        B.find(None, extra, barrier)
    p = D.Parting("extra", extra, None, None, None, barrier)
    verdict = blame.judge(p, 0, 1, {0: [extra], 1: [barrier]}, majority=False)
    assert verdict.side is None and verdict.unreadable == path
    assert "could not be read" in verdict.why


def test_a_fault_at_one_point_under_a_rank_check_is_no_gate(tmp_path):
    """`if rank == 1 and step == 2: break` (branch_kinds' loop_break): the break is the
    odd behaviour, not a gate letting rank 0 alone into the rest of the loop."""
    path, br = _two_sides(tmp_path, """
        def f(rank, step):
            for micro in range(3):
                dist.all_reduce(x)  # before
                if rank == 1 and step == 2 and micro == 1:  # guard
                    break
            dist.all_reduce(y)  # after

        f(rank, step)  # call
        """, "# before", "# after", before="# before")
    assert br.line == _line(path, "# guard") and br.kind == "rank" and not br.gate
