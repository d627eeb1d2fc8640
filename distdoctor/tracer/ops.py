"""What each ProcessGroup method means: op name, kind, and how to read its arguments.

A `ProcessGroup` method receives its arguments positionally from C++ callers (DDP's
reducer, functional collectives) and sometimes by keyword from `torch.distributed`'s
Python functions, so each reader takes both. Only methods that do not call one another
in torch's C++ base are wrapped (the old aliases `_allgather_base`, `alltoall_base`,
`allgather_into_tensor_coalesced`, ... forward to the ones below), so every op is seen
exactly once.

Method names move between torch releases: before torch 2.13 the "single" ops were bound
only under their old names (`_allgather_base`, `_reduce_scatter_base`, `alltoall_base`,
`allgather_into_tensor_coalesced`, `reduce_scatter_tensor_coalesced`), which were then the
real methods. `resolve` picks, per op, the first name the running torch binds; an op whose
names are all absent (`gather_single` before torch 2.15) does not exist there, and is not
traced. Nothing is assumed about a release: every name is looked up.

`backend_method` names the same operation on the c10d `Backend` (gloo, NCCL) that the
group dispatches to; the tracing group calls it directly (see process_group.py for why).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

import torch.distributed as dist

from distdoctor.runlog import format as F


@dataclass(frozen=True)
class OpSpec:
    method: str  # ProcessGroup method name
    op: str  # name recorded (torch.distributed's public name)
    kind: int  # format.KIND_*
    describe: Callable  # (args, kwargs) -> (inputs, outputs, opts, peer)
    params: tuple = ()  # the method's parameter names, in order
    backend_method: str | None = None  # the same op on a c10d Backend, if bound there
    aliases: tuple = ()  # older torch's names of the same ProcessGroup method, newest first
    code: int = field(init=False)  # the op's number in the event log

    def __post_init__(self):
        object.__setattr__(self, "code", F.OP_CODE[self.op])

    def positional(self, args, kwargs):
        """All arguments as a tuple, or None when a keyword cannot be placed."""
        if not kwargs:
            return args
        out = list(args)
        for name in self.params[len(args):]:
            if name not in kwargs:
                break
            out.append(kwargs[name])
        return tuple(out) if len(out) - len(args) == len(kwargs) else None


def _arg(args, kwargs, i, name):
    if len(args) > i:
        return args[i]
    return kwargs.get(name)


def _flat(x) -> list:
    """Tensors in a tensor, a list of tensors or a list of lists, in order."""
    if x is None:
        return []
    if isinstance(x, (list, tuple)):
        out = []
        for item in x:
            if isinstance(item, (list, tuple)):
                out.extend(item)
            else:
                out.append(item)
        return out
    return [x]


def _inplace(opts_index=1):
    """Ops that work on one list of tensors in place (all_reduce, broadcast, reduce)."""
    def describe(args, kwargs):
        tensors = _flat(_arg(args, kwargs, 0, "tensors"))
        return tensors, tensors, _arg(args, kwargs, opts_index, "opts"), None
    describe.form = "inplace" if opts_index == 1 else None  # runlog/_fast.c reads it so
    return describe


def _out_in(out_name="output_tensors", in_name="input_tensors"):
    """Ops with (outputs, inputs, opts): gathers, scatters, all-to-all."""
    def describe(args, kwargs):
        outs = _flat(_arg(args, kwargs, 0, out_name))
        ins = _flat(_arg(args, kwargs, 1, in_name))
        return ins, outs, _arg(args, kwargs, 2, "opts"), None
    describe.form = "out_in"  # runlog/_fast.c reads positional arguments so
    return describe


def _all_to_all_single(args, kwargs):
    out = _flat(_arg(args, kwargs, 0, "output"))
    ins = _flat(_arg(args, kwargs, 1, "input"))
    return ins, out, _arg(args, kwargs, 4, "opts"), None


def _barrier(args, kwargs):
    return [], [], _arg(args, kwargs, 0, "opts"), None


def _monitored_barrier(args, kwargs):
    return [], [], None, None


def _send(args, kwargs):
    return _flat(_arg(args, kwargs, 0, "tensors")), [], None, _arg(args, kwargs, 1, "dstRank")


def _recv(args, kwargs):
    return [], _flat(_arg(args, kwargs, 0, "tensors")), None, _arg(args, kwargs, 1, "srcRank")


def _recv_anysource(args, kwargs):
    return [], _flat(_arg(args, kwargs, 0, "tensors")), None, -1


C, P = F.KIND_COLLECTIVE, F.KIND_P2P
_T = ("tensors", "opts")
_OI = ("output_tensors", "input_tensors", "opts")
_SINGLE = ("output", "input", "opts")
_MANY = ("outputs", "inputs", "opts")
SPECS = [
    OpSpec("allreduce", "all_reduce", C, _inplace(), _T, "allreduce"),
    OpSpec("allreduce_coalesced", "all_reduce_coalesced", C, _inplace(), _T,
           "allreduce_coalesced"),
    OpSpec("broadcast", "broadcast", C, _inplace(), _T, "broadcast"),
    OpSpec("reduce", "reduce", C, _inplace(), _T, "reduce"),
    OpSpec("allgather", "all_gather", C, _out_in(), _OI, "allgather"),
    OpSpec("allgather_coalesced", "all_gather_coalesced", C,
           _out_in("output_lists", "input_list"), ("output_lists", "input_list", "opts"),
           "allgather_coalesced"),
    OpSpec("all_gather_single", "all_gather_into_tensor", C, _out_in("output", "input"),
           _SINGLE, "_allgather_base", aliases=("_allgather_base",)),
    OpSpec("all_gather_single_coalesced", "all_gather_into_tensor_coalesced", C,
           _out_in("outputs", "inputs"), _MANY, aliases=("allgather_into_tensor_coalesced",)),
    OpSpec("reduce_scatter", "reduce_scatter", C, _out_in(), _OI, "reduce_scatter"),
    OpSpec("reduce_scatter_single", "reduce_scatter_tensor", C, _out_in("output", "input"),
           _SINGLE, "_reduce_scatter_base", aliases=("_reduce_scatter_base",)),
    OpSpec("reduce_scatter_single_coalesced", "reduce_scatter_tensor_coalesced", C,
           _out_in("outputs", "inputs"), _MANY, aliases=("reduce_scatter_tensor_coalesced",)),
    OpSpec("alltoall", "all_to_all", C, _out_in(), _OI, "alltoall"),
    OpSpec("all_to_all_single", "all_to_all_single", C, _all_to_all_single,
           ("output", "input", "output_split_sizes", "input_split_sizes", "opts"),
           "alltoall_base", aliases=("alltoall_base",)),
    OpSpec("gather", "gather", C, _out_in(), _OI, "gather"),
    OpSpec("gather_single", "gather_into_tensor", C, _out_in("output", "input"), _SINGLE,
           "gather_single"),  # torch >= 2.15 (its alias gather_into_tensor forwards here)
    OpSpec("scatter", "scatter", C, _out_in(), _OI, "scatter"),
    OpSpec("barrier", "barrier", C, _barrier, ("opts",), "barrier"),
    OpSpec("monitored_barrier", "monitored_barrier", C, _monitored_barrier,
           ("timeout", "wait_all_ranks"), "monitored_barrier"),
    OpSpec("send", "send", P, _send, ("tensors", "dstRank", "tag"), "send"),
    OpSpec("recv", "recv", P, _recv, ("tensors", "srcRank", "tag"), "recv"),
    OpSpec("recv_anysource", "recv_anysource", P, _recv_anysource, ("tensors", "tag"),
           "recv_anysource"),
]


def resolve(group_class, specs=SPECS) -> tuple[list[OpSpec], list[OpSpec]]:
    """(the specs to wrap on this torch, each under the name it binds; the specs with no
    name bound at all). A spec found under an alias is a copy carrying that name, which is
    the name the override must have for pybind11 to call it from C++."""
    found, absent = [], []
    for spec in specs:
        name = next((n for n in (spec.method, *spec.aliases) if hasattr(group_class, n)), None)
        if name is None:
            absent.append(spec)
        else:
            found.append(spec if name == spec.method else replace(spec, method=name))
    return found, absent


# On the running torch, once: each op under the name this torch binds it by, which the
# tracing group wraps (process_group.py); an op this torch lacks is not there to trace.
# Both tables go into each rank's metadata (support.py).
TRACED, ABSENT = resolve(dist.ProcessGroup)
TRACED_OPS = {spec.op: spec.method for spec in TRACED}
ABSENT_OPS = [spec.op for spec in ABSENT]
