"""The step as the job's framework counts it, read from the framework, never imported.

Users read their framework's counter in logs, dashboards and checkpoint names:
HF `Trainer.state.global_step`, Lightning's `trainer.global_step`. Both count optimizer
steps taken, and both add one *after* `optimizer.step()` returns. The framework's loop
is on the stack when a batch is fetched and when the optimizer steps, so the trainer is
found there, by package identity (the top-level module of the `self` of a frame), at a
step boundary, and read at each later one. Accelerate keeps no counter of optimizer
steps (its `step` counts micro-batches): there, as in a plain loop, the count is the
optimizer steps taken.

Costs a walk of the stack at the first boundaries until a trainer is found (at most
SEARCHES of them), then one attribute read a step. Never raises.
"""

from __future__ import annotations

import sys
import weakref

SEARCHES = 64  # boundaries searched for a trainer before giving up
_MAX_DEPTH = 200


class Counter:
    """A framework's step counter: `name` as shown ("global_step (HF Trainer)")."""

    def __init__(self, read, name: str):
        self._read = read
        self.name = name

    def read(self) -> int | None:
        try:
            value = self._read()
        except Exception:
            return None
        return value if isinstance(value, int) and not isinstance(value, bool) else None


def _top(obj) -> str:
    return (type(obj).__module__ or "").partition(".")[0]


def _hf(obj) -> Counter | None:
    state = getattr(obj, "state", None)
    if not isinstance(getattr(state, "global_step", None), int):
        return None
    ref = weakref.ref(obj)
    return Counter(lambda: ref().state.global_step, "global_step (HF Trainer)")


def _lightning(obj) -> Counter | None:
    trainer = obj
    if type(obj).__name__ != "Trainer":
        try:  # a loop, strategy or module of Lightning's holds its trainer
            trainer = getattr(obj, "trainer", None)
        except Exception:  # a LightningModule not attached raises
            return None
    if trainer is None or _top(trainer) != _top(obj) or not isinstance(
            getattr(trainer, "global_step", None), int):
        return None
    ref = weakref.ref(trainer)
    return Counter(lambda: ref().global_step, "global_step (Lightning)")


_READERS = {"transformers": _hf, "lightning": _lightning, "pytorch_lightning": _lightning}


def find_counter(frame) -> Counter | None:
    """The counter of a known framework's trainer whose method is on the stack."""
    depth = 0
    while frame is not None and depth < _MAX_DEPTH:
        code = frame.f_code
        if code.co_argcount and code.co_varnames[0] == "self":
            obj = frame.f_locals.get("self")
            reader = _READERS.get(_top(obj)) if obj is not None else None
            if reader is not None:
                try:
                    counter = reader(obj)
                except Exception:
                    counter = None
                if counter is not None and counter.read() is not None:
                    return counter
        frame = frame.f_back
        depth += 1
    return None


def counter_here() -> Counter | None:
    try:
        return find_counter(sys._getframe(2))
    except Exception:
        return None
