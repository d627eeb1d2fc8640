"""Find the user's line that issued a collective.

Walk out from the current frame past torch, distdoctor and the standard library; the
first frame left is the user's. Whether a code object is "internal" is decided once and
cached, so the walk costs a few dictionary look-ups per frame. Ops issued where the
current thread has no user frame (autograd's worker threads run DDP's and FSDP's hooks)
take the main thread's innermost user frame: the line that called `backward()`.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import threading

import torch

import distdoctor

_INTERNAL_DIRS = tuple(
    os.path.dirname(p) + os.sep
    for p in (torch.__file__, distdoctor.__file__)
) + tuple(
    os.path.realpath(d) + os.sep
    for d in {sysconfig.get_paths().get("stdlib"), sysconfig.get_paths().get("platstdlib")}
    if d
)
_internal: dict = {}  # code object -> bool
_MAIN_THREAD_ID = threading.main_thread().ident


def _is_internal(code) -> bool:
    hit = _internal.get(code)
    if hit is None:
        name = code.co_filename
        hit = name.startswith("<") or os.path.realpath(name).startswith(_INTERNAL_DIRS) \
            or name.startswith(_INTERNAL_DIRS)
        _internal[code] = hit
    return hit


def user_frame(frame):
    """The innermost non-internal frame at or above `frame`, or None."""
    while frame is not None:
        if not _is_internal(frame.f_code):
            return frame
        frame = frame.f_back
    return None


def find_user_frame():
    """(frame, from_main_thread) for the current op; frame may be None."""
    frame = user_frame(sys._getframe(2))
    if frame is not None:
        return frame, False
    if threading.get_ident() != _MAIN_THREAD_ID:
        main = sys._current_frames().get(_MAIN_THREAD_ID)
        frame = user_frame(main)
        if frame is not None:
            return frame, True
    return None, False
