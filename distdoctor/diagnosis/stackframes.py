"""Read a stack dump (py-spy's, or faulthandler's) back into frames: where a rank that is
in no collective actually is, as a call site a finding can name."""

from __future__ import annotations

import re

# py-spy:        "    hang_in_compute (reference_trainer/faults.py:220)"
_PYSPY = re.compile(r"^\s+(?P<function>\S.*?) \((?P<file>.+):(?P<line>\d+)\)\s*$")
# faulthandler:  '  File "/abs/faults.py", line 220 in hang_in_compute'
_FAULT = re.compile(r'^\s+File "(?P<file>.+)", line (?P<line>\d+) in (?P<function>.+?)\s*$')
_THREAD = re.compile(r"^(Thread|Current thread) ")
_INTERNAL = ("site-packages/", "/lib/python3", "<frozen", "torch/", "distdoctor/",
             "threading.py", "runpy.py", "selectors.py", "queue.py")


def _internal(file: str) -> bool:
    f = file.replace("\\", "/")
    if "reference_trainer" in f:  # distdoctor's own demo trainer is user code
        return False
    return any(s in f for s in _INTERNAL)


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


def user_frame(text: str) -> dict | None:
    """The innermost user-code frame of the main thread (else of any thread)."""
    ts = threads(text)
    ts.sort(key=lambda t: 0 if ("MainThread" in t[0] or t[0].startswith("Current")) else 1)
    for _, frames in ts:
        for frame in frames:
            if not _internal(frame["file"]):
                return frame
    return None
