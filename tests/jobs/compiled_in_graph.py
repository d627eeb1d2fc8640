"""One process, no process group: compiles `in_graph` with the backend named in ARGV[1]
and prints, as JSON, the call site distdoctor gives an op dynamo put in the graph (a
custom op standing for a functional collective), and whether torch ran the graph in
torch.fx.Interpreter rather than from an FX graph module's generated code.

(No `from __future__ import annotations` here: torch 2.4's custom_op reads the
annotations as types, not strings.)"""

import json
import os
import sys

import torch

from distdoctor.tracer import compiled
from distdoctor.tracer.callsite import user_frame

seen = []


@torch.library.custom_op("distdoctor_test::probe", mutates_args=())
def probe_in_graph(x: torch.Tensor) -> torch.Tensor:
    site = compiled.site_of(user_frame(sys._getframe(1)))
    frame, interpreted = sys._getframe(1), False
    while frame is not None:  # torch 2.4's aot_eager runs the graph in torch.fx.Interpreter
        interpreted |= frame.f_code.co_filename.endswith(f"fx{os.sep}interpreter.py")
        frame = frame.f_back
    seen.append(dict(site, interpreted=interpreted))
    return x.clone()


@probe_in_graph.register_fake
def _(x):
    return torch.empty_like(x)


def in_graph(x):
    y = x * 2
    y = probe_in_graph(y)  # expect: in_graph
    return y + 1


def main():
    torch.compile(in_graph, backend=sys.argv[1])(torch.ones(3))  # expect: calls_in_graph
    print(json.dumps(seen))


if __name__ == "__main__":
    main()
