"""Named spans (`distdoctor.trace`): mark step boundaries so findings can say which step.

    @distdoctor.trace                      # span named after the function
    @distdoctor.trace(name="train_step")   # span with a chosen name
    with distdoctor.trace("eval"): ...     # span around a block

A span costs one event-log record. Before the tracer is armed (no process group yet,
or not installed) a span does nothing.
"""

from __future__ import annotations

import functools

from distdoctor.tracer import state


def trace(fn_or_name=None, *, name: str | None = None):
    if callable(fn_or_name):
        return _decorate(fn_or_name, name or fn_or_name.__qualname__)
    return Span(fn_or_name if fn_or_name is not None else name)


class Span:
    """A reusable span: a context manager, or a decorator."""

    def __init__(self, name: str | None):
        self.name = name or "span"
        self._tokens: list = []

    def __enter__(self):
        rec = state.recorder
        self._tokens.append(rec.span_begin(self.name) if rec is not None else None)
        return self

    def __exit__(self, exc_type, exc, tb):
        token = self._tokens.pop() if self._tokens else None
        rec = state.recorder
        if rec is not None and token is not None:
            rec.span_end(token, failed=exc_type is not None)
        return False

    def __call__(self, fn):
        return _decorate(fn, self.name)


def _decorate(fn, name: str):
    @functools.wraps(fn)
    def traced(*args, **kwargs):
        rec = state.recorder
        token = rec.span_begin(name) if rec is not None else None
        failed = True
        try:
            result = fn(*args, **kwargs)
            failed = False
            return result
        finally:
            if token is not None and state.recorder is not None:
                state.recorder.span_end(token, failed=failed)

    return traced
