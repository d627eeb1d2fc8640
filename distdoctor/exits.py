"""How a process's end is named, for findings and for `run`'s own report: the launcher,
the crash detector and the log reader word a signal the same way."""

from __future__ import annotations

import signal


def signal_name(signum: int) -> str:
    """"SIGKILL" for 9; "signal N" for a number no signal has here."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
