"""The user's line at a graph break of a `torch.compile`d function, on every torch of the
matrix: dynamo runs the call it could not compile from code of its own, which on torch
2.4 has no line table (every instruction reads as the function's first line) and after
the first break is a resume function named `torch_dynamo_resume_in_step_at_N`. One
process, dynamo's eager backend: no inductor build, a few seconds."""


import json
import subprocess
import sys

import pytest
import torch
from conftest import JOBS, marker_lines

from distdoctor.tracer import compiled
from distdoctor.tracer.callsite import user_frame

pytestmark = pytest.mark.timeout(120)

seen: list[dict] = []


@torch._dynamo.disable  # dynamo cannot compile it: a graph break, called from dynamo's code
def probe(x):
    seen.append(compiled.site_of(user_frame(sys._getframe(1))))
    return x


@torch.compile(backend="eager")
def step(x):
    y = x * 2
    probe(y)  # expect: first_break
    y = y + 1
    probe(y)  # expect: second_break
    return y - 1


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_an_op_in_an_fx_graph_is_named_at_its_line_in_the_users_function(backend):
    """An op dynamo puts in the graph (as it does a functional collective) runs from the
    FX graph module's generated code under the eager and aot_eager backends. In a process
    of its own (tests/jobs/compiled_in_graph.py): AOT's caches left in this one print
    "Exception ignored" at its exit on torch 2.15."""
    job = JOBS / "compiled_in_graph.py"
    out = subprocess.run([sys.executable, str(job), backend], capture_output=True,
                         text=True, timeout=100)
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    lines = marker_lines("compiled_in_graph.py")
    assert len(seen) == 1, seen
    site = seen[0]
    assert backend == "aot_eager" or not site["interpreted"]  # eager runs the module's code
    if site["interpreted"]:  # no generated code, no line of its own: the calling line
        want = (lines["calls_in_graph"], "main")
    else:
        want = (lines["in_graph"], "in_graph")
    assert (site["file"], site["line"], site["function"], site.get("compiled")) == (
        str(job), *want, "in_graph"), seen


def test_a_graph_break_is_named_at_its_line_in_the_users_function():
    torch._dynamo.reset()
    seen.clear()
    step(torch.ones(3))
    lines = marker_lines(__file__)
    assert [(s["file"], s["line"], s["function"]) for s in seen] == [
        (__file__, lines["first_break"], "step"), (__file__, lines["second_break"], "step")]
    assert not any("compiled" in s for s in seen)  # a line of its own, not the caller's


def test_resume_functions_are_the_users_function():
    code = compile("def torch_dynamo_resume_in_train_step_at_12(): pass", "f.py", "exec")
    fn_code = next(c for c in code.co_consts if hasattr(c, "co_name"))
    assert compiled.function_name(fn_code) == "train_step"
    assert compiled.function_name(step.__wrapped__.__code__) == "step"
