"""Whether a rank's process is alive on this host (the live engine's liveness check)."""

from __future__ import annotations

import os


def pid_alive(pid) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return True  # unknown: do not declare it dead
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie has exited; only its parent has not reaped it yet
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True
