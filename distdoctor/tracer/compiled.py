"""Call sites through compiled code: the user's line inside a `torch.compile`d function.

A collective inside a compiled function is issued by code torch generated: inductor's
wrapper module in its cache directory (`.../torchinductor_USER/wz/cwz....py`, in
`Runner.call` or `call`), or an FX graph's `forward` (`<eval_with_key>.N`: the eager and
aot_eager backends, AOT autograd). The walk stops at either (callsite.py) so that each
generated line is a call site of its own. The line of the user's that issued it is kept
by torch in three places this module reads:

- at compile time, dynamo's graph: each node's `meta["stack_trace"]` is the user's
  stack at the moment dynamo traced it. `OutputGraph.call_user_compiler` is wrapped to
  keep, for each collective node, the user's innermost frame (file, line, function),
  keyed by the node's name. Once per compiled graph, a few microseconds a node.
- at run time, inductor's wrapper names the graph nodes each line comes from in the
  comment above it (`# Topologically Sorted Source Nodes: [y, tensor], ...`).
- at run time, an FX graph module maps each line of its generated `forward` to a node
  (`_lineno_map`, counted from the code's first line, as dynamo reads it itself), whose
  `meta["stack_trace"]` dynamo and AOT autograd keep.

So a generated frame's line is read once per call site (the recorder interns sites: the
hot path never comes here) and its nodes looked up. Where torch kept none of these (a
backend of another kind, an older or newer comment, torch 2.4's aot_eager running its
graph in torch.fx.Interpreter), the site is the line that called the compiled
function: a real line of the user's, never torch's generated file. Every step is feature
detected and falls back; nothing here raises.

Dynamo also must not compile distdoctor's own frames (the traced group's methods run
inside a compiled function's graph breaks, and dynamo treats the group as an opaque
object: its first attribute raised into the job). distdoctor is added to dynamo's skip
list as torch's own files are, when torch._dynamo is imported: never imported by us.
"""

from __future__ import annotations

import dis
import importlib.abc
import importlib.util
import linecache
import os
import re
import sys
import threading
from itertools import islice

from distdoctor.tracer.callsite import is_internal_file, user_frame

_MAX_NODES = 4096  # the node table's bound: a job compiles a few graphs, not thousands
# (file of the compiled function, node name) -> [(site dict, op key), ...]
_nodes: dict = {}
_FRAME_RE = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')
_SOURCE_RE = re.compile(r"Source Nodes: \[([^\]]*)\]")
_ATEN_RE = re.compile(r"Original ATen: \[([^\]]*)\]")
_lock = threading.Lock()
_hooked: set = set()


# --- which code is generated ----------------------------------------------------------
def _cache_dirs() -> tuple:
    dirs = [os.environ.get("TORCHINDUCTOR_CACHE_DIR")]
    return tuple(os.path.realpath(d) + os.sep for d in dirs if d)


_INDUCTOR_DIRS = _cache_dirs()


FX_FILE = "<eval_with_key>"  # the file name of an FX graph module's generated code


def is_generated(filename: str) -> bool:
    """Code torch wrote at run time (inductor's wrapper modules, FX graph modules): not
    the user's line, though inductor's file is real. Checked once per code object."""
    if filename.startswith(FX_FILE):
        return True
    parts = filename.split(os.sep)
    return any(p.startswith("torchinductor_") for p in parts[:-1]) or (
        bool(_INDUCTOR_DIRS) and filename.startswith(_INDUCTOR_DIRS))


# --- compile time: dynamo's nodes -----------------------------------------------------
def _is_collective(target) -> bool:
    """A node that issues a collective. Not functional collectives' `wait_tensor`: every
    graph of a function has one under that name, and two graphs of one function (the two
    arms of a branch dynamo specialised on) would share its key and its line."""
    text = getattr(target, "__module__", "") or ""
    if "wait_tensor" in str(target):
        return False
    return "c10d" in str(target) or "distributed" in text


def _user_frames(stack_trace: str, is_internal_file) -> tuple | None:
    """(outermost frame, innermost user frame) of a node's stack trace, as site dicts."""
    frames = [{"file": f, "line": int(n), "function": fn}
              for f, n, fn in _FRAME_RE.findall(stack_trace or "")]
    users = [f for f in frames if not is_internal_file(f["file"])]
    return (frames[0], users[-1]) if users else None


def remember_graph(gm) -> None:
    """Keep the user's line of each collective node of a graph dynamo hands a backend."""
    for node in gm.graph.nodes:
        if len(_nodes) >= _MAX_NODES:
            return
        if node.op != "call_function" or not _is_collective(node.target):
            continue
        found = _user_frames(node.meta.get("stack_trace"), is_internal_file)
        if found is None:
            continue
        outer, site = found
        entries = _nodes.setdefault((outer["file"], node.name), [])
        entry = (dict(site, compiled=outer["function"]), _op_name(node.target))
        if entry not in entries:
            entries.append(entry)


def _op_name(target) -> str:
    """'all_gather_into_tensor' of `torch.ops._c10d_functional.all_gather_into_tensor`:
    two graphs of one function name their collective nodes alike ("tensor"), so the op
    tells which graph's line a wrapper's line is."""
    return _op_key(str(getattr(target, "__name__", None) or target))


def _op_key(text: str) -> str:
    """One name for an op at dynamo's level and at inductor's: `all_gather_tensor`,
    `_c10d_functional.all_gather_into_tensor.default` -> 'all_gather'."""
    text = text.split(".default")[0].rsplit(".", 1)[-1]
    return text.replace("_into_tensor", "").replace("_tensor", "").rstrip("_")


def _wrap_call_user_compiler(module) -> None:
    cls = getattr(module, "OutputGraph", None)
    original = getattr(cls, "call_user_compiler", None)
    if original is None or getattr(original, "_distdoctor", False):
        return

    def call_user_compiler(self, gm, *args, **kwargs):
        try:
            remember_graph(gm)
        except Exception:
            pass
        return original(self, gm, *args, **kwargs)

    call_user_compiler._distdoctor = True
    call_user_compiler.__wrapped__ = original
    cls.call_user_compiler = call_user_compiler


def _skip_distdoctor(module) -> None:
    """The tracer and the spans run in the job's frames; the reference trainer, which
    installs under distdoctor too, is the user's code and stays compilable."""
    add = getattr(module, "add", None)
    if callable(add):
        for name in ("distdoctor.tracer", "distdoctor.spans"):
            add(name)


# --- run time: a generated frame's site -------------------------------------------------
def _source_nodes(filename: str, line: int) -> tuple[list[str], list[str]]:
    """The graph nodes the wrapper's line comes from, and the ops it names ("Original
    ATen: [_c10d_functional.all_gather_into_tensor]"), from the comment above it."""
    lines = linecache.getlines(filename)
    for i in range(line - 2, max(line - 6, -1), -1):  # the comment sits just above
        if i >= len(lines):
            continue
        m = _SOURCE_RE.search(lines[i])
        if m:
            aten = _ATEN_RE.search(lines[i])
            ops = [_op_key(o.strip()) for o in aten.group(1).split(",")] if aten else []
            return [n.strip() for n in m.group(1).split(",") if n.strip()], ops
    return [], []


def frame_site(frame) -> dict:
    """{file, line, function} of a frame as the user wrote it: a line torch 2.4's dynamo
    code lost is the graph break's (break_line), and a resume function of dynamo's
    (`torch_dynamo_resume_in_step_at_25`) is the user's function (`step`)."""
    code = frame.f_code
    return {"file": code.co_filename, "line": break_line(frame) or frame.f_lineno,
            "function": function_name(code)}


def function_name(code) -> str:
    m = _RESUMED_RE.match(code.co_name)
    return m.group(1) if m else getattr(code, "co_qualname", code.co_name)


_RESUMED_RE = re.compile(r"torch_dynamo_resume_in_(.+)_at_(\d+)$")
_breaks: dict = {}  # id(code) -> (code, graph call's offset, resume load's offset, resume name)


def break_line(frame) -> int | None:
    """The line of the graph break `frame` stands at, where its code lost it; else None.

    dynamo's code for a compiled function up to a graph break calls the graph
    (`__compiled_fn_N`), then makes the call it could not compile, then calls
    `__resume_at_*` for the rest. On torch 2.4 that code has no line table: every
    instruction reads as the function's first line. The break's line survives in the
    resume function's name (`torch_dynamo_resume_in_step_at_25`), and the frame's
    instruction tells the break's call (between the two) from the graph's. Newer torch
    keeps the lines: this is None there. Once per code object (a site's first sighting).
    """
    if not _dynamo_at_first_line(frame):
        return None
    code = frame.f_code
    shape = _breaks.get(id(code))
    if shape is None or shape[0] is not code:
        shape = _breaks[id(code)] = (code, *_segment_shape(code))
    _, graph_call, resume_load, resume = shape
    if graph_call is None or resume_load is None or not graph_call < frame.f_lasti < resume_load:
        return None
    fn = frame.f_globals.get(resume)
    m = _RESUMED_RE.match(getattr(getattr(fn, "__code__", None), "co_name", "") or "")
    return int(m.group(2)) if m else None


def _segment_shape(code) -> tuple:
    """(offset of the call of the graph, offset of the load of the resume function, its
    name) in dynamo's code for a segment of a compiled function; Nones where not one."""
    graph_load = graph_call = None
    try:
        for ins in dis.get_instructions(code):
            name = ins.argval if isinstance(ins.argval, str) else ""
            if graph_load is None:
                if ins.opname.startswith("LOAD") and name.startswith("__compiled_fn"):
                    graph_load = ins.offset
            elif graph_call is None:
                if ins.opname.startswith("CALL"):
                    graph_call = ins.offset
            elif ins.opname.startswith("LOAD") and name.startswith("__resume_at"):
                return graph_call, ins.offset, name
    except Exception:
        pass
    return None, None, None


def site_of(frame) -> dict:
    """{file, line, function} of the frame the call-site walk stopped at; for code torch
    generated (a compiled function's collective), the user's line it came from."""
    code = frame.f_code
    if is_generated(code.co_filename):
        try:
            site = _site_of_generated(frame)
            if site is not None:
                return site
        except Exception:
            pass
    elif runs_a_graph(frame):
        # dynamo's frame of a compiled function, calling a graph that left no line of
        # its own on the stack (FX code of an aot_eager or other backend): the frame
        # stands at the function's first line, which issued nothing
        caller = _past_generated(frame.f_back)
        if caller is not None:
            fn = function_name(code)
            site = frame_site(caller)
            site.update(compiled=fn, called_from=_text(site))
            return site
    return frame_site(frame)


def runs_a_graph(frame) -> bool:
    """dynamo's frame of a compiled function: at its first line, calling its graph (not
    at a graph break, whose line break_line finds)."""
    return _dynamo_at_first_line(frame) and break_line(frame) is None


def _dynamo_at_first_line(frame) -> bool:
    """dynamo's code for a compiled function (it calls a `__compiled_fn_N` graph),
    standing at the function's first line."""
    code = frame.f_code
    return frame.f_lineno == code.co_firstlineno and any(
        n.startswith("__compiled_fn") for n in code.co_names)


def _text(site: dict) -> str:
    return f"{site['file']}:{site['line']} in {site['function']}"


def _past_generated(frame):
    """The innermost user frame at or above `frame` that torch did not generate."""
    frame = user_frame(frame)
    while frame is not None and is_generated(frame.f_code.co_filename):
        frame = user_frame(frame.f_back)
    return frame


def _site_of_generated(frame) -> dict | None:
    """The user's site for an op issued from generated code `frame`: the line in the
    compiled function when dynamo kept it, else the line that called the compiled
    function; with `called_from`, that line. None when no user frame is found."""
    compiled = _past_generated(frame.f_back)  # dynamo's frame of the compiled function
    if compiled is None:
        return None
    caller = _past_generated(compiled.f_back)
    fn = function_name(compiled.f_code)
    if frame.f_code.co_filename.startswith(FX_FILE):
        site = _fx_site(frame)
        if site is not None and runs_a_graph(compiled):
            site["compiled"] = fn
    else:
        site = _inductor_site(frame, compiled, fn)
    if site is None and not runs_a_graph(compiled):
        # not dynamo's frame: a graph run from the user's own line (a compiled backward
        # from `loss.backward()`), which is the site
        return frame_site(compiled)
    if site is None:  # torch kept no line inside: the call of the compiled function
        site = frame_site(caller) if caller is not None else frame_site(compiled)
        site["compiled"] = fn
    else:
        site = dict(site)
    if caller is not None:
        site["called_from"] = _text(frame_site(caller))
    return site


def _inductor_site(frame, compiled, fn: str) -> dict | None:
    """The user's line of an inductor wrapper's line: its source nodes' (the comment
    above it), as dynamo's graph of the compiled function kept them."""
    names, ops = _source_nodes(frame.f_code.co_filename, frame.f_lineno)
    for name in names:
        entries = _nodes.get((compiled.f_code.co_filename, name)) or []
        ranked = sorted(entries, key=lambda e: (e[1] not in ops, e[0]["compiled"] != fn))
        if ranked:
            return ranked[0][0]
    return None


def _fx_site(frame) -> dict | None:
    """The user's line of the node an FX graph module's `forward` frame stands at, from
    the node's stack trace; None where the module kept no map or no trace (a graph the
    user traced without stack traces)."""
    module = frame.f_locals.get("self")
    lines = getattr(module, "_lineno_map", None)
    graph = getattr(module, "graph", None)
    if not lines or graph is None:
        return None
    index = lines.get(frame.f_lineno - frame.f_code.co_firstlineno)
    node = None if index is None else next(islice(graph.nodes, index, None), None)
    found = None if node is None else _user_frames(node.meta.get("stack_trace"),
                                                    is_internal_file)
    return None if found is None else {k: found[1][k] for k in ("file", "line", "function")}


# --- hooks, installed once, acting when torch imports the module ----------------------
_AFTER = {"torch._dynamo.trace_rules": _skip_distdoctor,
          "torch._dynamo.output_graph": _wrap_call_user_compiler}


class _AfterImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        then = _AFTER.get(name)
        if then is None or name in _hooked:
            return None
        _hooked.add(name)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_hook(module):
            exec_module(module)
            _run(then, module)

        spec.loader.exec_module = exec_and_hook
        return spec


def _run(then, module) -> None:
    try:
        then(module)
    except Exception:
        pass  # an older or newer torch without it: sites stay the caller's line


def install() -> None:
    """Once per process: hook dynamo now if imported, else when it is."""
    with _lock:
        if "installed" in _hooked:
            return
        _hooked.add("installed")
        pending = False
        for name, then in _AFTER.items():
            module = sys.modules.get(name)
            if module is not None:
                _hooked.add(name)
                _run(then, module)
            else:
                pending = True
        if pending:
            sys.meta_path.insert(0, _AfterImport())
