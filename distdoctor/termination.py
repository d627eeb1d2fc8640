"""A command that leaves something behind (a pack unpacked into the temp dir, a check's
ranks and their folder) ends on SIGTERM and SIGHUP through its `finally` blocks, as it
does on Ctrl-C. By default those signals end the process where it stands: a scheduler's
cancel left GiBs of unpacked run dir in /tmp, and a check's ranks running on.

No import of distdoctor: every layer may use it. Only the main thread can set handlers
or is sure to take a signal; elsewhere both helpers do nothing."""

from __future__ import annotations

import contextlib
import signal
import threading

_ENDING = (signal.SIGTERM, signal.SIGHUP)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def ends_through_finally():
    """For the block's length, SIGTERM and SIGHUP raise SystemExit(128 + signal) where
    the program stands. A handler the command set itself stays its own."""
    if not _main_thread():
        yield
        return
    before = {}

    def leave(signum, frame):
        for sig in before:  # a second signal must not cut the cleanup short
            signal.signal(sig, signal.SIG_IGN)
        raise SystemExit(128 + signum)

    for sig in _ENDING:
        if signal.getsignal(sig) is signal.SIG_DFL:
            before[sig] = signal.signal(sig, leave)
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def termination_held():
    """SIGTERM and SIGHUP held back (pending, not lost) for the block's length: around
    making a thing and naming it, so that the `finally` which removes it knows of it, and
    around that removal, so that a signal does not cut it short. Start no process
    inside: a child inherits the mask, and would ignore SIGTERM too."""
    if not _main_thread() or not hasattr(signal, "pthread_sigmask"):
        yield
        return
    before = signal.pthread_sigmask(signal.SIG_BLOCK, _ENDING)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)
