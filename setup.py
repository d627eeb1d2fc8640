"""The optional C hot paths: the tracer's and the event log's slot writer
(distdoctor/runlog/_fast.c), the readers' slot decoder (distdoctor/runlog/_decode.c) and
the diagnosis engine's common ingest (distdoctor/diagnosis/engine/_ingest.c).

Everything else is in pyproject.toml. The extensions are optional: without a compiler or
Python headers the build goes on and the tracer and the readers run their pure-Python
paths, which record and read the same events (tests/test_native.py holds the writers to the
same bytes, tests/test_native_decode.py the readers to the same events,
tests/test_native_ingest.py the engine to the same state).
"""

import platform
import sys

from setuptools import Extension, setup

native = sys.implementation.name == "cpython" and sys.version_info >= (3, 11) and (
    platform.system() != "Windows")
# (module, source): the slot writer and decoder, and the engine's common ingest
SOURCES = [("distdoctor.runlog._fast", "distdoctor/runlog/_fast.c"),
           ("distdoctor.runlog._decode", "distdoctor/runlog/_decode.c"),
           ("distdoctor.diagnosis.engine._ingest", "distdoctor/diagnosis/engine/_ingest.c")]
HEADERS = ["distdoctor/runlog/slot_layout.h", "distdoctor/runlog/slot_fields.h",
           "distdoctor/diagnosis/engine/ingest_base.h",
           "distdoctor/diagnosis/engine/ingest_completion.h"]
setup(ext_modules=[Extension(module, [source], include_dirs=["distdoctor/runlog"],
                             depends=HEADERS, extra_compile_args=["-O2", "-Wall"],
                             optional=True)
                   for module, source in SOURCES] if native else [])
