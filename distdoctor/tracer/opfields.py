"""Reading an op's options and tensors cheaply: what the recorder's Python path (and the
C path's slow cases, runlog/_fast.c) reads from a call, each pybind access at most once.

A failed getattr on a pybind object costs an exception and the reduce op's number two
pybind objects, so what each options class has is asked once per class, and the reduce
op is read the cheapest way this torch allows (checked once at import).
"""

from __future__ import annotations

FIELDS: dict[type, tuple[bool, bool, bool]] = {}


def fields_of(opts_type) -> tuple[bool, bool, bool]:
    """Which of reduceOp, rootRank, asyncOp an options class has (a failed getattr on a
    pybind object costs an exception; this asks once per class)."""
    fields = FIELDS.get(opts_type)
    if fields is None:
        fields = FIELDS[opts_type] = tuple(hasattr(opts_type, name) for name in
                                            ("reduceOp", "rootRank", "asyncOp"))
    return fields


def _reduce_op_reader():
    """int(opts.reduceOp.op) costs ~1.4 us (two pybind objects); hash(opts.reduceOp) is
    the op's number in the torch versions that define ReduceOp.__hash__ so (~0.5 us).
    Checked once against every op type; the slow read otherwise."""
    try:
        from torch.distributed import ReduceOp

        # PREMUL_SUM is built only by _make_nccl_premul_sum; the others by ReduceOp(op)
        ops = [v for k, v in vars(ReduceOp.RedOpType).items()
               if k.isupper() and k != "PREMUL_SUM"]
        if ops and all(hash(ReduceOp(op)) == int(op) for op in ops):
            return hash
    except Exception:
        pass
    return lambda reduce_op: int(reduce_op.op)


reduce_op_number = _reduce_op_reader()


def numel(tensors) -> int:
    """Elements in a list of tensors (one tensor, the common case, without a generator)."""
    return tensors[0].numel() if len(tensors) == 1 else sum(t.numel() for t in tensors)
