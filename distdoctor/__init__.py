"""distdoctor: diagnostics for distributed PyTorch training.

    import distdoctor
    distdoctor.install()                 # trace every process group created from now on

    @distdoctor.trace                    # a named span (step boundary) around a function
    def train_step(batch): ...

    with distdoctor.trace("eval"):       # or around a block
        ...

Importing this package is cheap (no torch import); the tracer loads when installed.

This package owns that API; its subpackages are layered (docs/architecture.md).
Layer: sensors (tests/test_layers.py), with the tracer it fronts. May import the tracer
and `spans.py` only.
"""

from distdoctor.spans import trace

__version__ = "0.1.0"
__all__ = ["install", "trace", "__version__"]


def install(run_dir: str | None = None) -> None:
    """Trace every collective of this process from now on, into `run_dir`.

    Call it before `torch.distributed.init_process_group` (or run the script under
    `distdoctor run`, which needs no call at all). Safe without torch.distributed: the
    tracer arms itself when a process group is created. Never raises.
    """
    from distdoctor.tracer.install import install as _install

    _install(run_dir)
