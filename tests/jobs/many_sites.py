"""One process on torch's fake backend issuing all-reduces from many lines: a helper from
two callers, 150 generated functions (more sites than the C core's first table sizes),
and a thread; three rounds, so every site is met again. Prints nothing."""

import threading

import torch
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore

from distdoctor.tracer import install

install._BUILTIN_BACKENDS.add("fake")  # traced here as gloo is
dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
t = torch.ones(1)
GENERATED = 150


def helper():
    dist.all_reduce(t)  # expect: helper


source = "".join(f"def f{i}(t):\n    dist.all_reduce(t)\n" for i in range(GENERATED))
namespace = {"dist": dist}
exec(compile(source, "/generated/sites.py", "exec"), namespace)
functions = [namespace[f"f{i}"] for i in range(GENERATED)]

for _round in range(3):
    helper()  # expect: first caller
    helper()  # expect: second caller
    for f in functions:
        f(t)
    side = threading.Thread(target=helper, name="side-thread")
    side.start()
    side.join()
dist.destroy_process_group()
