"""The optional C hot path of the tracer and the event log's slot writer
(distdoctor/runlog/_fast.c).

Everything else is in pyproject.toml. The extension is optional: without a compiler or
Python headers the build goes on and the tracer runs its pure-Python path, which records
the same events (tests/test_native.py holds the two to the same bytes).
"""

import platform
import sys

from setuptools import Extension, setup

native = sys.implementation.name == "cpython" and sys.version_info >= (3, 11) and (
    platform.system() != "Windows")
setup(ext_modules=[Extension("distdoctor.runlog._fast", ["distdoctor/runlog/_fast.c"],
                             extra_compile_args=["-O2", "-Wall"], optional=True)]
      if native else [])
