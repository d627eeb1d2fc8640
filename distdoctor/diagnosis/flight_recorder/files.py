"""Flight Recorder dump files: finding one set of them by prefix, and reading each safely.

Security: unpickling runs code. A dump is a tree of dicts, lists, strings and numbers, so
the unpickler refuses every global; a crafted file is `Unreadable`, never runs.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import re
from collections import defaultdict
from pathlib import Path

from distdoctor.errors import UserError
from distdoctor.runlog.rundir import MAX_WORLD_SIZE

MAX_DUMP_BYTES = 1 << 30  # 2000 entries with stacks is a few MB; a GB is not a dump
READS_MAJOR = 2  # Flight Recorder format versions "2.x" (and older) are understood
_NAME = re.compile(r"(\d+)(\.json|\.pkl|\.pickle)?$")


class _Refused(pickle.UnpicklingError):
    pass


class _NoGlobals(pickle.Unpickler):
    """Builds only pickle's own types; any class or function (os.system...) is refused."""

    def find_class(self, module, name):
        raise _Refused(f"refused to load {module}.{name}, which no dump holds: a crafted file?")


class Unreadable(Exception):
    """A dump that cannot be used; the message says why, in one line."""


def find_dump_files(prefix: str) -> dict[int, Path]:
    """rank -> file, for PREFIX<rank>[.json|.pkl]; PREFIX may also be a directory of one
    set of dumps (any common file-name prefix)."""
    p = Path(prefix).expanduser()
    if p.is_dir():
        folder, stem = p, None
    else:
        folder, stem = p.parent, p.name
    try:
        names = sorted(f.name for f in folder.iterdir() if f.is_file())
    except OSError:
        return {}
    sets: dict[str, dict[int, Path]] = defaultdict(dict)
    for name in names:
        m = _NAME.search(name)
        if m is None or (stem is not None and name[:m.start()] != stem):
            continue
        rank = int(m.group(1))  # (a file name's digits: 255 at most)
        if rank >= MAX_WORLD_SIZE:
            continue  # no rank's dump: a number past any job's world (a date, a stamp)
        found = sets[name[:m.start()]]
        if rank in found:  # e.g. both a pickle and a JSON dump of one rank
            raise UserError(f"two dumps of rank {rank}: {found[rank]} and {folder / name}; "
                            f"keep one", 2)
        found[rank] = folder / name
    if len(sets) > 1:
        found = ", ".join(str(folder / s) for s in sorted(sets))
        raise UserError(f"{prefix} holds several sets of dumps ({found}): pass one prefix", 2)
    return next(iter(sets.values()), {})


def read_dump(path: Path) -> dict:
    """A dump's top-level dict, from pickle or JSON (told apart by content)."""
    try:
        with open(path, "rb") as fh:
            # a file's size first: one over the bound is refused without reading a GiB
            if os.fstat(fh.fileno()).st_size > MAX_DUMP_BYTES:
                raise Unreadable(f"{path} is over {MAX_DUMP_BYTES >> 20} MiB: not a dump")
            data = fh.read(MAX_DUMP_BYTES + 1)
    except OSError as exc:
        raise Unreadable(f"cannot read {path}: {exc.strerror}") from None
    if len(data) > MAX_DUMP_BYTES:
        raise Unreadable(f"{path} is over {MAX_DUMP_BYTES >> 20} MiB: not a dump")
    head = data.lstrip()[:1]
    try:
        if head == b"{":
            dump = json.loads(data)
        elif head == b"\x80":  # pickle protocol 2 and later
            dump = _NoGlobals(io.BytesIO(data)).load()
        else:
            raise Unreadable(f"{path} is not a Flight Recorder dump (neither pickle nor JSON)")
    except Unreadable:
        raise
    except _Refused as exc:
        raise Unreadable(f"{path}: {exc}") from None
    except Exception as exc:  # truncated or corrupt: EOFError, ValueError, RecursionError...
        truncated = isinstance(exc, EOFError) or "truncated" in str(exc)
        what = "truncated" if truncated else f"corrupt: {type(exc).__name__}"
        raise Unreadable(f"{path} is unreadable ({what})") from None
    if not isinstance(dump, dict) or not isinstance(dump.get("entries", []), list) or not (
            "entries" in dump or "pg_config" in dump):
        raise Unreadable(f"{path} is not a Flight Recorder dump")
    version = str(dump.get("version", "0"))
    major = version.split(".")[0]
    if major.isdigit() and int(major) > READS_MAJOR:
        raise Unreadable(f"{path} has Flight Recorder format {version}; this distdoctor "
                          f"reads up to {READS_MAJOR}.x: upgrade distdoctor")
    return dump
