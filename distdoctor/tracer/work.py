"""CPU works' completion: a Work wrapper whose completion is the caller's own wait, and
the done-callback that records the others (DoneCallback).

The wrapper's use: gloo's send/recv works have no future and never report `is_completed()` until
someone waits, and waiting on them from a second thread is unsafe (two waiters, one
completion). The caller's `wait()` is the completion, recorded when it returns. Everything
else is passed through. (Synchronous ops need no wrapper: the recorder waits on them
itself.)
"""

from __future__ import annotations

from collections import OrderedDict

import torch
import torch.distributed as dist

from distdoctor.tracer.support import parse_version

# A Work made in Python and handed to a C++ caller (functional collectives, DTensor) lives
# on as a C++ object after Python drops it. Before torch 2.9 (seen on 2.4.1 and 2.6.0; 2.9.1
# keeps it) that C++ object does not keep its Python half alive: its wait() then finds no
# Python override and runs the base Work::wait, which waits forever. There, each of ours is
# held until it is waited on; bounded, oldest first, for works a caller drops unwaited. Only
# there: holding a work changes what a dropped one does (gloo loses a dropped isend's
# message; a held one is delivered), and a traced job must behave as an untraced one.
_UNWAITED_MAX = 4096
_unwaited: OrderedDict = OrderedDict()
_HOLD = (parse_version(torch.__version__) or (99, 0)) < (2, 9)


def _hold(work) -> None:
    if not _HOLD:
        return
    _unwaited[id(work)] = work
    if len(_unwaited) > _UNWAITED_MAX:
        _unwaited.popitem(last=False)


def _release(work) -> None:
    _unwaited.pop(id(work), None)


class RecordingWork(dist.Work):
    # The last waited-on work, kept alive until the next one is waited on. gloo's worker
    # thread drops its own reference just after it completes a work; if ours were gone
    # first, the work's destructor would run there and need the GIL to release the
    # tensors' Python objects: a GIL hand-off per op, and at interpreter exit a thread
    # killed inside a destructor (std::terminate; seen as SIGABRT). Held one op longer,
    # the work is freed here, in a thread that holds the GIL. Costs: one op's tensors.
    _last_waited = None

    def __init__(self, inner, on_done):
        super().__init__()
        self._inner = inner
        self._on_done = on_done
        _hold(self)

    def wait(self, timeout=None):
        _release(self)
        try:
            result = self._inner.wait() if timeout is None else self._inner.wait(timeout)
        except BaseException as exc:
            self._report(exc)
            raise
        RecordingWork._last_waited = self._inner
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
        return self._inner.get_future()  # raises: only works without a future are wrapped


class JoinedWork(dist.Work):
    """One Work for several backend ops issued as one (a coalesced op split per tensor):
    waiting waits for each, in order; done when all are done."""

    def __init__(self, works):
        super().__init__()
        self._works = list(works)
        _hold(self)

    def wait(self, timeout=None):
        _release(self)
        for w in self._works:
            if timeout is None:
                w.wait()
            else:
                w.wait(timeout)
        return True

    def is_completed(self):
        return all(w.is_completed() for w in self._works)

    def is_success(self):
        return all(w.is_success() for w in self._works)

    def exception(self):
        for w in self._works:
            exc = w.exception()
            if exc is not None:
                return exc
        return None

    def synchronize(self):
        for w in self._works:
            w.synchronize()

    def get_future(self):
        raise RuntimeError("getFuture not implemented")  # completion is seen by waiting


class DoneCallback:
    """An async CPU op's done-callback, counted in `alive` for as long as it exists.

    torch holds the callable in a guard (`PythonFunctionGuard`) that gloo's worker thread
    frees after the call has returned, taking the GIL a second time to do so. A thread
    that asks for the GIL once the interpreter is finalizing is ended by pthread_exit,
    and that unwind through the guard's destructor is std::terminate: the rank dies of
    SIGABRT at exit ("terminate called without an active exception"; caught in a core
    dump of a traced DDP job on torch 2.13: `~PythonFunctionGuard` in
    `Future::markCompleted` on a `pt_gloo_runloop` thread). So the exit waits until the
    callable is freed, not merely called: it leaves `alive` in `__del__`, which runs
    inside that destructor's hold of the GIL. `list.append` and `list.pop` are atomic
    under the GIL: no lock, which a `__del__` run by a collection could wait on forever.
    """

    __slots__ = ("_done", "_e", "_alive")

    def __init__(self, done, e: int, alive: list):
        self._done, self._e, self._alive = done, e, alive
        alive.append(None)

    def __call__(self, fut) -> None:
        self._done(self._e, fut)

    def __del__(self) -> None:
        try:
            self._alive.pop()
        except IndexError:
            pass
