"""How a rank leaves, said in its log: the status it gave sys.exit or os._exit, and the
user's line that called it.

A rank that calls `sys.exit()` in the middle of training (its shard is done, a check
failed) leaves the others waiting in their next collective; the hang or crash is then
named at that line, not at the rank's last op. os._exit skips the exit hooks, so its
status is written at the call. sys.exit only raises SystemExit, which a job may catch and
go on: the call is kept in memory (`Recorder.exit_call`) and written by the exit hook,
and the rank's next step or batch forgets it (tracer/steps.py); on another thread than
the main one it ends only that thread, and is not kept (a worker thread's sys.exit(3) in
a job that went on to exit 0 was named a crash of every rank). `raise SystemExit` and
the `exit()` builtin are not seen: such a rank's exit is read as closed, status unknown.

The wrappers never raise anything of their own into the job. This module is imported
by the start-up hook (launch/bootstrap), before torch: it must not import torch.
"""

from __future__ import annotations

import os
import sys
import threading

from distdoctor.tracer import state


def exit_status(arg) -> int:
    """The process's exit status for sys.exit(arg), as Python computes it."""
    if arg is None:
        return 0
    if isinstance(arg, int):
        return arg & 0xFF
    return 1  # a message: printed to stderr, status 1


def call_record(how: str, arg, frame) -> dict:
    """{type, code, [message], file, line, function} of the exit call made in `frame`."""
    record = {"type": how, "code": exit_status(arg)}
    if arg is not None and not isinstance(arg, int):
        record["message"] = str(arg)[:300]
    from distdoctor.tracer import callsite  # it imports torch: not at start-up

    user = callsite.user_frame(frame)
    if user is not None:
        code = user.f_code
        record.update(file=code.co_filename, line=user.f_lineno,
                      function=getattr(code, "co_qualname", code.co_name))
        skip = _harness_skip(record["code"], code.co_filename)
        if skip is not None:
            record["skip"] = skip
    return record


def _harness_skip(status: int, filename: str) -> str | None:
    """torch's distributed test harness ends a rank with one of its TEST_SKIPS codes to
    say that the test is skipped (torch/testing/_internal/common_distributed.py): that
    skip's message, for a status that is not a failure; else None."""
    if f"{os.sep}torch{os.sep}testing{os.sep}" not in filename:
        return None
    harness = sys.modules.get("torch.testing._internal.common_distributed")
    for skip in (getattr(harness, "TEST_SKIPS", None) or {}).values():
        if getattr(skip, "exit_code", None) == status:
            return str(getattr(skip, "message", "skipped"))
    return None


def write_exit_call(rec) -> None:
    """At exit (Recorder.close): the sys.exit call that is ending the process, if one
    is, goes in the log with its status."""
    call = rec.exit_call
    if call is None or os.getpid() != rec._pid:
        return
    try:
        rec.ring.mark_exited(call["code"], rec.ring.add_string(call))
    except Exception:
        pass


def _keep(rec, call: dict) -> None:
    """The exit call to write at exit. A second call with no user frame and the same
    status passes the first one on (multiprocessing's child catches the SystemExit of
    the user's sys.exit and calls sys.exit, or os._exit, with its code): the first says
    where."""
    held = rec.exit_call
    if held is not None and "file" not in call and held.get("code") == call["code"]:
        return
    rec.exit_call = call


def hook_exits() -> None:
    """Wrap sys.exit and os._exit, once per process."""
    if not getattr(sys.exit, "_distdoctor", False):
        real_sys_exit = sys.exit

        def exit(status=None):
            rec = state.recorder
            if rec is not None:
                try:
                    # elsewhere SystemExit ends only its thread: the rank goes on
                    if os.getpid() == rec._pid and threading.current_thread() is (
                            threading.main_thread()):
                        _keep(rec, call_record("sys.exit", status, sys._getframe(1)))
                except Exception:
                    pass
            real_sys_exit(status)

        exit._distdoctor = True
        sys.exit = exit
    if not getattr(os._exit, "_distdoctor", False):
        real_os_exit = os._exit

        def _exit(status):
            rec = state.recorder
            if rec is not None and isinstance(status, int):
                try:
                    if os.getpid() == rec._pid:
                        _keep(rec, call_record("os._exit", status, sys._getframe(1)))
                        rec.exiting(status, rec.exit_call)
                except Exception:
                    pass
            real_os_exit(status)

        _exit._distdoctor = True
        os._exit = _exit
