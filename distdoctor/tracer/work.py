"""The Work the tracer hands back for CPU ops: completion is seen through the caller.

Completion is recorded when the caller's own `wait()` returns, or, for callers that use
the future instead (DDP's reducer), when the future completes. Why not a done-callback on
every op's future: it runs on gloo's worker thread and costs a GIL hand-off per op; and
gloo's send/recv works have no future at all, never report `is_completed()` until waited
on, and cannot safely be waited on from a second thread (two waiters, one completion).
Everything else is passed through to the real work.
"""

from __future__ import annotations

import torch.distributed as dist


class RecordingWork(dist.Work):
    def __init__(self, inner, on_done):
        super().__init__()
        self._inner = inner
        self._on_done = on_done

    def wait(self, timeout=None):
        try:
            result = self._inner.wait() if timeout is None else self._inner.wait(timeout)
        except BaseException as exc:
            self._report(exc)
            raise
        self._report(None)
        return result

    def _report(self, exc) -> None:
        on_done, self._on_done = self._on_done, None
        if on_done is not None:
            try:
                on_done(exc)
            except Exception:
                pass

    def is_completed(self):
        return self._inner.is_completed()

    def is_success(self):
        return self._inner.is_success()

    def exception(self):
        return self._inner.exception()

    def source_rank(self):
        return self._inner.source_rank()

    def _source_rank(self):
        return self._inner._source_rank()

    def result(self):
        return self._inner.result()

    def synchronize(self):
        return self._inner.synchronize()

    def get_future(self):
        fut = self._inner.get_future()
        if self._on_done is not None:
            fut.add_done_callback(self._future_done)
        return fut

    def _future_done(self, fut) -> None:
        try:
            fut.value()
        except Exception as exc:
            self._report(exc)
            return
        self._report(None)
