"""The sources a run kept (runlog/sources.py: RUN_DIR/sources/) in multi-node collection:
each node sends its manifest and the copies it names (SOURCE frames, to a collector whose
WELCOME asks for them), and the collector keeps them in its copy's sources/, so that
`diagnose` on the copy reads the program the job ran, as it does on the node.

    SOURCE payload   the file's name, b"\\n", its bytes; the name is `manifest.json` or
                     `<sha256>.src` (and those bytes hash to it), nothing else

Bounded on both sides as the ranks bound their own: a file at most KEEP_FILE_BYTES (1
MiB, a manifest too), the copies of a run (the collector's copy, every node's together)
at most KEEP_RUN_BYTES (8 MiB), the merged manifest MAX_FILES entries. The collector takes
a manifest's known fields only (their text made printable), and writes into a private
sources/ (0700, opened O_NOFOLLOW and checked, privatefiles.PrivateDir) under fresh names
renamed into place: never through a link, never elsewhere. A path two nodes name keeps the
first node's entry; an entry whose copy the collector does not hold says why.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import stat
import threading
import time
from pathlib import Path

from distdoctor.collect import wire
from distdoctor.privatefiles import PrivateDir, PrivateDirRefused, read_regular
from distdoctor.runlog import sources as S
from distdoctor.safetext import printable

COPY_NAME = re.compile(r"[0-9a-f]{64}\.src\Z")
MAX_PATH = 4096
MAX_MERGED_BYTES = 4 << 20  # the merged manifest's entries, as JSON (~20,000 files)
WRITE_EVERY_S = 1.0  # a merged manifest past SMALL_BYTES is rewritten at most this often
SMALL_BYTES = 64 << 10
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def source_frame(name: str, data: bytes) -> bytes:
    return wire.frame(wire.SOURCE, name.encode() + b"\n" + data)


class SourceSender:
    """A node's side: the manifest when it changed, after the copies it names not sent
    yet on this connection (KEEP_RUN_BYTES of them at most)."""

    def __init__(self, run_dir: str | os.PathLike):
        self.dir = Path(run_dir) / S.DIR
        self.reset()

    def reset(self) -> None:
        """A new connection: everything again (it may be another collector)."""
        self.sent: set[str] = set()
        self.sent_bytes = 0
        self._stamp = None
        self._manifest: bytes | None = None

    def forward(self, send) -> str | None:
        """Sends what changed through `send(frame)`; a line to say, or None."""
        try:
            st = os.lstat(self.dir / S.MANIFEST)
        except OSError:
            return None
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        if stamp == self._stamp:
            return None
        data = read_regular(self.dir / S.MANIFEST, S.KEEP_FILE_BYTES)
        if data is None:
            self._stamp = stamp
            return (f"the run's sources/{S.MANIFEST} is over {S.KEEP_FILE_BYTES >> 20} MiB "
                    f"(or unreadable): the collector's copy keeps no sources")
        try:
            files = json.loads(data).get("files")
        except (ValueError, UnicodeDecodeError, AttributeError):
            return None  # (written whole, renamed into place: a foreign file) next pass
        for entry in files.values() if isinstance(files, dict) else ():
            name = entry.get("copy") if isinstance(entry, dict) else None
            if not isinstance(name, str) or not COPY_NAME.match(name) or name in self.sent:
                continue
            self.sent.add(name)
            body = read_regular(self.dir / name, S.KEEP_FILE_BYTES)
            if (body is None or hashlib.sha256(body).hexdigest() != name[:64]
                    or self.sent_bytes + len(body) > S.KEEP_RUN_BYTES):
                continue
            send(source_frame(name, body))
            self.sent_bytes += len(body)
        if data != self._manifest:
            send(source_frame(S.MANIFEST, data))
            self._manifest = data
        self._stamp = stamp
        return None


def parse(payload: bytes) -> tuple[str, bytes]:
    """A SOURCE frame's (name, bytes), checked; WireError otherwise."""
    raw, sep, data = payload.partition(b"\n")
    name = raw.decode("ascii", "replace")
    if not sep or not (name == S.MANIFEST or COPY_NAME.match(name)):
        raise wire.WireError(f"SOURCE frame names {name[:80]!r} (not manifest.json or "
                             f"<sha256>.src)")
    if len(data) > S.KEEP_FILE_BYTES:
        raise wire.WireError(f"SOURCE frame of {len(data):,} bytes (at most "
                             f"{S.KEEP_FILE_BYTES:,})")
    if name != S.MANIFEST and hashlib.sha256(data).hexdigest() != name[:64]:
        raise wire.WireError(f"SOURCE frame {name[:12]}...: its bytes are not that hash")
    return name, data


def _text(value, limit: int = 256) -> str | None:
    return printable(value, limit) if isinstance(value, str) else None


def clean_entry(entry) -> dict | None:
    """A manifest entry's known fields, each of its type (runlog/sources.py describe)."""
    if not isinstance(entry, dict):
        return None
    out: dict = {}
    sha = entry.get("sha256")
    if isinstance(sha, str) and re.fullmatch(r"[0-9a-f]{64}", sha):
        out["sha256"] = sha
        if entry.get("copy") == f"{sha}.src":
            out["copy"] = entry["copy"]
    size = entry.get("size")
    if isinstance(size, int) and not isinstance(size, bool) and 0 <= size < 1 << 62:
        out["size"] = size
    for key in ("why", "missing", "library", "version"):
        text = _text(entry.get(key))
        if text is not None:
            out[key] = text
    return out


def _files_of(data: bytes) -> dict:
    """A node's manifest's files, checked as the readers check one (read_manifest)."""
    try:
        m = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise wire.WireError("SOURCE manifest is not JSON") from None
    files = m.get("files") if isinstance(m, dict) else None
    if (not isinstance(files, dict) or m.get("format") != S.FORMAT
            or not isinstance(m.get("version"), int) or m["version"] > S.VERSION):
        raise wire.WireError("SOURCE manifest is not a distdoctor-sources manifest")
    return files


class SourceCopies:
    """The collector's side: every node's manifest merged, and the copies, in the copy's
    private sources/."""

    def __init__(self, run_dir: str | os.PathLike):
        self.run_dir = Path(run_dir)
        self._lock = threading.Lock()
        self._dir: PrivateDir | None = None
        self._refused = False
        self.merged: dict[str, dict] = {}  # path -> entry (the first node's to name it)
        self.merged_bytes = 0
        self.named: set[str] = set()  # the copies merged entries name
        self.present: dict[str, int] = {}  # copy name -> bytes
        self._dirty = False  # the manifest on disk is behind (WRITE_EVERY_S)
        self._written_s = 0.0
        old = S.read_manifest(self.run_dir)  # a collector started again on its copy
        for path, entry in (old or {}).get("files", {}).items():
            self._add(path, clean_entry(entry))
        try:
            names = os.listdir(self.run_dir / S.DIR)
        except OSError:
            names = []
        for name in names:
            try:
                st = os.lstat(self.run_dir / S.DIR / name)
            except OSError:
                continue
            if COPY_NAME.match(name) and stat.S_ISREG(st.st_mode):
                self.present[name] = st.st_size

    @property
    def kept_bytes(self) -> int:
        return sum(self.present.values())

    def apply(self, payload: bytes) -> None:
        name, data = parse(payload)
        files = _files_of(data) if name == S.MANIFEST else None
        try:
            self._apply(name, data, files)
        except OSError as exc:  # a full disk: as with a log's copy, the node is dropped
            raise wire.WireError(f"cannot write the copy's sources/{name}: "
                                 f"{exc.strerror or exc}") from None

    def _apply(self, name: str, data: bytes, files: dict | None) -> None:
        with self._lock:
            folder = self._open()
            if folder is None:
                return
            if files is not None:
                self._dirty |= self._merge(files)
            elif (name not in self.present and len(self.present) < S.MAX_FILES
                    and self.kept_bytes + len(data) <= S.KEEP_RUN_BYTES):
                folder.write(name, data)  # O_EXCL | O_NOFOLLOW, renamed: 0600
                self.present[name] = len(data)
                self._dirty |= name in self.named
            if self._dirty and (self.merged_bytes <= SMALL_BYTES
                                or time.monotonic() - self._written_s >= WRITE_EVERY_S):
                self._flush(folder)

    def _flush(self, folder: PrivateDir) -> None:
        folder.write(S.MANIFEST, self._manifest())
        self._dirty, self._written_s = False, time.monotonic()

    def _open(self) -> PrivateDir | None:
        if self._dir is None and not self._refused:
            try:
                self._dir = PrivateDir.open(str(self.run_dir / S.DIR))
            except (PrivateDirRefused, OSError):
                self._refused = True  # a link or another's there: nothing written through it
        return self._dir

    def _merge(self, files: dict) -> bool:
        changed = False
        for path, entry in files.items():
            if path not in self.merged:
                changed |= self._add(path, clean_entry(entry))
        return changed

    def _add(self, path: str, entry: dict | None) -> bool:
        """A path's entry, within the bounds; whether it was taken."""
        if entry is None or len(path) > MAX_PATH or printable(path, MAX_PATH) != path:
            return False
        size = len(path) + len(json.dumps(entry)) + 8
        if len(self.merged) >= S.MAX_FILES or self.merged_bytes + size > MAX_MERGED_BYTES:
            return False
        self.merged[path] = entry
        self.merged_bytes += size
        if "copy" in entry:
            self.named.add(entry["copy"])
        return True

    def _manifest(self) -> bytes:
        files = {}
        for path, entry in self.merged.items():
            if "copy" in entry and entry["copy"] not in self.present:
                entry = {k: v for k, v in entry.items() if k != "copy"}
                entry.setdefault("why", f"not in the collector's copy (its "
                                        f"{S.KEEP_RUN_BYTES >> 20} MiB of copies are taken)")
            files[path] = entry
        manifest = {**S.empty_manifest(), "kept_bytes": self.kept_bytes, "files": files}
        return (json.dumps(manifest, indent=1) + "\n").encode()

    def close(self) -> None:
        with self._lock:
            if self._dir is not None:
                if self._dirty:
                    with contextlib.suppress(OSError):
                        self._flush(self._dir)
                self._dir.close()
                self._dir = None
