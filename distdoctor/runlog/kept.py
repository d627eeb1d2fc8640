"""The sources a run kept (runlog/sources.py), read back: the text the diagnosis reads for
a file a call site names, and what a pack carries of them.

The kept copy is read where there is one (said once when the file on disk differs from
it); without one (over the bounds, `--no-source`), the file on disk only when its hash
is the run's (said once otherwise). A run dir that kept nothing (older than the keeping,
or a file the run never noted) leaves the caller to read the disk as before.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from distdoctor.privatefiles import read_regular
from distdoctor.runlog import sources as S

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def _read_copy(run_dir: Path, name) -> bytes | None:
    if not isinstance(name, str) or "/" in name or name.startswith("."):
        return None
    return read_regular(run_dir / S.DIR / name, S.KEEP_FILE_BYTES)


def _disk_sha(path: str) -> str | None:
    entry, _ = S.describe(path) if S.library_of(path) is None else ({}, None)
    return entry.get("sha256")


class KeptSources:
    """What a run kept of its sources, and the text the diagnosis should read for a
    path: the kept copy; without one, the file on disk when its hash is the run's.
    `notes`: one line per file that differs from the run's (said once)."""

    def __init__(self, run_dir: str | os.PathLike):
        self.run_dir = Path(run_dir)
        self._stamp = self._mtime()
        self.manifest = S.read_manifest(self.run_dir)
        self.notes: list[str] = []
        self._noted: set[str] = set()

    def _mtime(self) -> int | None:
        try:
            return os.stat(self.run_dir / S.DIR / S.MANIFEST).st_mtime_ns
        except OSError:
            return None

    def _refresh(self) -> None:
        """A live run's manifest grows while it is read: taken again when it changed."""
        stamp = self._mtime()
        if stamp != self._stamp:
            self._stamp, self.manifest = stamp, S.read_manifest(self.run_dir)

    def _say(self, path: str, line: str) -> None:
        if path not in self._noted:
            self._noted.add(path)
            self.notes.append(line)

    def text(self, path: str) -> tuple[bool, str | None]:
        """(decided, text): decided False where the run says nothing of `path` (an older
        run dir, a file no call site named): the caller reads the disk as before."""
        if self.manifest is None or path not in self.manifest["files"]:
            self._refresh()
        if self.manifest is None:
            return False, None
        entry = self.manifest["files"].get(path)
        if entry is None:
            return False, None
        sha = entry.get("sha256")
        data = _read_copy(self.run_dir, entry.get("copy")) if entry.get("copy") else None
        if data is not None and isinstance(sha, str) and \
                hashlib.sha256(data).hexdigest() == sha:
            now = _disk_sha(path)
            if now is not None and now != sha:
                self._say(path, f"{path} changed since the run: the diagnosis reads the "
                                f"copy the run kept")
            return True, data.decode("utf-8", "replace")
        if not isinstance(sha, str):
            return False, None  # a library's file, or one the run could not read
        now, disk = S.describe(path)  # (a regular file only: never a FIFO's wait)
        if disk is None:
            return True, None
        if now.get("sha256") != sha:
            why = entry.get("why") or "no copy"
            self._say(path, f"{path} changed since the run, which kept no copy of it "
                            f"({why}): not read")
            return True, None
        return True, disk.decode("utf-8", "replace")


_current: KeptSources | None = None


def attach(run_dir: str | os.PathLike) -> KeptSources:
    """The run whose sources the diagnosis reads from now on (every reader of a run dir
    calls it: runlog.rundir.open_run_dir)."""
    global _current
    path = Path(run_dir)
    if _current is None or _current.run_dir != path:
        _current = KeptSources(path)
    return _current


def current() -> KeptSources | None:
    return _current


# --- packing ---------------------------------------------------------------------------
def for_pack(run_dir: Path, named: list[str], copies: bool, notes: list[str]):
    """(name, bytes) of the sources/ entries of a pack of `run_dir`: its manifest, and
    unless `copies` is False its kept copies. A file the run's call sites name that the
    run kept nothing of (an older run dir) is taken from the disk now, within the same
    bounds, and marked "packed" (its content is the disk's at pack time). Only a Python
    source of the run dir's owner is taken so: the call sites are the ranks' word (a
    crafted log named any file, which went into the pack, made to be shared)."""
    manifest = S.read_manifest(run_dir) or S.empty_manifest()
    try:
        owner = os.stat(run_dir).st_uid
    except OSError:
        owner = -1  # (no file is of that uid: none is read from the disk)
    out: dict[str, bytes] = {}
    for entry in manifest["files"].values():
        name = entry.get("copy")
        if not name:
            continue
        data = _read_copy(run_dir, name) if copies else None
        if data is not None and hashlib.sha256(data).hexdigest() == entry.get("sha256"):
            out[name] = data
        else:
            entry.pop("copy")
            entry["why"] = "copies left out (--no-source)" if not copies else "copy lost"
    manifest["kept_bytes"] = sum(len(b) for b in out.values())
    taken = []
    for path in dict.fromkeys(named):
        if (path in manifest["files"] or len(manifest["files"]) >= S.MAX_FILES
                or not path.endswith(".py")):
            continue
        entry, data = S.describe(path, owner)
        if "missing" in entry:
            continue
        S.place(entry, data, manifest, copies, out.__setitem__)
        if entry.get("copy"):
            entry["packed"] = True
            taken.append(path)
        manifest["files"][path] = entry
    if taken:
        notes.append(f"the run kept no copy of {len(taken)} source file(s) "
                     f"({', '.join(taken[:3])}{', ...' if len(taken) > 3 else ''}): "
                     f"packed as they are on disk now")
    if not manifest["files"]:
        return
    for name, data in sorted(out.items()):
        yield f"{S.DIR}/{name}", data
    yield f"{S.DIR}/{S.MANIFEST}", (json.dumps(manifest, indent=1) + "\n").encode()
