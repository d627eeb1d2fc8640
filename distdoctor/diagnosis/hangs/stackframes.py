"""Read a stack dump (py-spy's, or faulthandler's) back into frames: where a rank that is
in no collective actually is, as a call site a finding can name."""

from __future__ import annotations

import re

# py-spy:        "    hang_in_compute (reference_trainer/faults.py:220)"
_PYSPY = re.compile(r"^\s+(?P<function>\S.*?) \((?P<file>.+):(?P<line>\d+)\)\s*$")
# faulthandler:  '  File "/abs/faults.py", line 220 in hang_in_compute'
_FAULT = re.compile(r'^\s+File "(?P<file>.+)", line (?P<line>\d+) in (?P<function>.+?)\s*$')
# a thread's head; "Stack (most recent call first):" heads a dump of the current thread
# alone (distdoctor's own signal-triggered dump: the main thread's)
_THREAD = re.compile(r"^(Thread|Current thread|Stack) ")
# Not the user's code: installed packages, the standard library, torch and distdoctor.
# Paths come absolute (faulthandler, Flight Recorder) or package-relative (py-spy:
# "torch/distributed/distributed_c10d.py"), so packages match either way.
_LIBRARY = ("-packages/", "/lib/python3", "<frozen", "threading.py", "runpy.py",
            "selectors.py", "queue.py")
_PACKAGES = ("torch/", "distdoctor/")


def is_library(path: str, strict: bool = True) -> bool:
    """Whether a frame's file is library code rather than the user's. `strict=False` is
    a second look for when no frame passed the first: the user's code may be an
    installed package, but torch and the standard library still are not it."""
    f = path.replace("\\", "/")
    if "reference_trainer" in f or "torch/testing/" in f:  # code that plays the user's part
        return False
    if strict:
        return any(s in f for s in _LIBRARY) or any(
            f.startswith(p) or "/" + p in f for p in _PACKAGES)
    stdlib = "/lib/python3" in f and "-packages/" not in f
    return f.startswith("torch/") or "/torch/" in f or "<frozen" in f or stdlib


def threads(text: str) -> list[tuple[str, list[dict]]]:
    """(thread header, frames innermost first) for each thread in the dump."""
    out: list[tuple[str, list[dict]]] = []
    for line in text.splitlines():
        if _THREAD.match(line):
            out.append((line.strip(), []))
            continue
        m = _PYSPY.match(line) or _FAULT.match(line)
        if m and out:
            out[-1][1].append({"file": m["file"], "line": int(m["line"]),
                               "function": m["function"]})
    return out


def is_main_head(line: str) -> bool:
    """Whether a thread's head line is the main thread's (py-spy names it; faulthandler
    says which thread it ran on, which for distdoctor's dump is the main thread)."""
    return "MainThread" in line or line.startswith(("Current thread", "Stack (most recent"))


def user_frame(text: str) -> dict | None:
    """The innermost user-code frame of the main thread (else of any thread)."""
    ts = threads(text)
    ts.sort(key=lambda t: 0 if is_main_head(t[0]) else 1)
    for _, frames in ts:
        for frame in frames:
            if not is_library(frame["file"]):
                return frame
    return None
