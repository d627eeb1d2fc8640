"""Arms distdoctor in every Python process started under `distdoctor run`.

Python imports `sitecustomize` at start-up; `distdoctor run` puts this folder first on
PYTHONPATH, the way coverage.py reaches subprocesses. It costs an environment look-up and
an import hook: torch is not imported here. A `sitecustomize` that this one shadows is
still run afterwards.
"""

import os
import sys


def _arm():
    if not os.environ.get("DISTDOCTOR_RUN_DIR"):
        return
    try:
        from distdoctor.tracer.install import install_import_hook

        install_import_hook()
    except Exception as exc:  # never stop the user's program from starting
        print(f"distdoctor: tracer not armed: {exc!r}", file=sys.stderr)


def _chain():
    """Run the sitecustomize this file shadows, if there is one."""
    here = os.path.dirname(os.path.abspath(__file__))
    import importlib.util

    saved, this = sys.path[:], sys.modules.pop("sitecustomize", None)
    try:
        sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
        spec = importlib.util.find_spec("sitecustomize")
        if spec is not None and spec.origin and os.path.dirname(spec.origin) != here:
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
    except Exception:
        pass
    finally:
        sys.path[:] = saved
        if this is not None:
            sys.modules["sitecustomize"] = this


_arm()
_chain()
