"""The optional C hot paths: the tracer's and the event log's slot writer
(distdoctor/runlog/_fast.c), and the readers' slot decoder (distdoctor/runlog/_decode.c).

Everything else is in pyproject.toml. The extensions are optional: without a compiler or
Python headers the build goes on and the tracer and the readers run their pure-Python
paths, which record and read the same events (tests/test_native.py holds the writers to the
same bytes, tests/test_native_decode.py the readers to the same events).
"""

import platform
import sys

from setuptools import Extension, setup

native = sys.implementation.name == "cpython" and sys.version_info >= (3, 11) and (
    platform.system() != "Windows")
setup(ext_modules=[Extension(f"distdoctor.runlog.{name}", [f"distdoctor/runlog/{name}.c"],
                             depends=["distdoctor/runlog/slot_layout.h"],
                             extra_compile_args=["-O2", "-Wall"], optional=True)
                   for name in ("_fast", "_decode")] if native else [])
