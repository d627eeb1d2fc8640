"""How a process's end is named, for findings and for `run`'s own report: the launcher,
the crash detector and the log reader word a signal the same way. And exits.json's
entries, checked one by one (`exit_entry`, `read_exit_entries`): the collector takes a
node's in through the same check every reader of the file uses."""

from __future__ import annotations

import signal

from distdoctor.safetext import printable  # (the base layer too)


def signal_name(signum: int) -> str:
    """"SIGKILL" for 9; "signal N" for a number no signal has here."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


# --- exits.json: one entry per process --------------------------------------------------
# Written by `run` (and its guardian), and in a collector's copy from the nodes' EXITS
# frames. Each entry is checked on its own, by the collector when it takes a node's in and
# by every reader: one bad entry is skipped, never the whole file's exit codes lost.

MAX_RANK = 1 << 24
MAX_TEXT = 200  # a signal's name, where an exit came from, the node it was lost with
_INT64 = 1 << 63
_TEXT_FIELDS = ("signal", "from", "lost_with_node")


def exit_entry(p) -> dict | None:
    """A process entry of exits.json, checked and normalized (only the fields distdoctor
    reads, strings bounded and printable), or None when it is not one: a rank that is not
    a small integer or null, an exit code that is not an integer or null, a pid that is
    not an integer or null, a flag that is not a boolean, a text that is not a string."""
    if not isinstance(p, dict):
        return None
    rank, code, pid = p.get("rank"), p.get("exit_code"), p.get("pid")
    stopped = p.get("stopped_by_distdoctor", False)
    if not (_int_or_none(rank) and (rank is None or 0 <= rank < MAX_RANK)
            and _int_or_none(code) and (code is None or -_INT64 <= code < _INT64)
            and _int_or_none(pid) and (pid is None or 0 <= pid < _INT64)
            and isinstance(stopped, bool)):
        return None
    out = {"rank": rank, "pid": pid, "exit_code": code, "stopped_by_distdoctor": stopped}
    for key in _TEXT_FIELDS:
        value = p.get(key)
        if value is not None and not isinstance(value, str):
            return None
        if key == "signal" or value is not None:
            out[key] = None if value is None else _printable(value)
    return out


def _int_or_none(x) -> bool:
    return x is None or (isinstance(x, int) and not isinstance(x, bool))


def _printable(text: str) -> str:
    return printable(text, MAX_TEXT)


MAX_EXITS_BYTES = 64 << 20  # ~150 bytes a process: a copy's 262,144 ranks and their kin


def read_exit_entries(path) -> tuple[dict, list[dict], int]:
    """exits.json at `path`: (its top-level flags, its process entries that are sound,
    how many were skipped as unsound). OSError / ValueError when the file itself cannot
    be read (a FIFO, a link, over MAX_EXITS_BYTES: privatefiles.read_json) or is not a
    JSON object."""
    from distdoctor.privatefiles import read_json

    data = read_json(path, MAX_EXITS_BYTES)
    if not isinstance(data, dict):
        raise ValueError("exits.json is not a JSON object")
    processes = data.get("processes")
    if not isinstance(processes, list):
        processes = []
    entries = [e for e in map(exit_entry, processes) if e is not None]
    flags = {k: data.get(k) is True for k in ("stopped_by_distdoctor", "run_died")}
    return flags, entries, len(processes) - len(entries)
