"""A run dir in one file (`distdoctor pack`), and a pack read back as a run dir.

A run dir is sparse: each rank's log is a 64 MiB file of which a short job writes a few
hundred KiB. Copied by the tools people move evidence with, it becomes 64 MiB a rank. A
pack holds what the readers read: each log's header, the string table's used bytes and
the slots of the events still in the ring (nothing of the rest), and every other file of
the run dir as it is (run.json, findings, exits, probes, stacks, the kept sources).

Format version 1 (docs/run-dir.md, "The pack"):

    "DDOCPACK" u32 version u32 flags(0)
    entry*: u8 kind, u8 0, u16 name length, u32 CRC-32 of the raw bytes, u64 raw length,
            u64 stored length; the name (utf-8, a relative path); the stored bytes (zlib)
    end:    kind END, name length 0, CRC 0, raw length = the entries before it, stored
            length 32; SHA-256 of every byte of the file before the end entry

A RING entry's raw bytes are a log made small: u64 file size, u64 first event, u64
events, u64 string bytes; the log's 4 KiB header; the string table's used bytes; the
events' 128-byte slots, oldest first, stored byte-column by byte-column (byte 0 of every
slot, then byte 1, ...: the columns of a slot change little from one event to the next,
which is what zlib finds). A FILE entry's raw bytes are the file.

Reading a pack is `runlog.unpack.unpacked(path)`: a private temp dir (0700) where every file is made
again with O_EXCL | O_NOFOLLOW (each log sparse, at its size), removed after. Everything
read is bounded (entries, names, sizes, what each entry inflates to; the trailer's
checksum is checked before the run dir is handed over); a pack that is truncated,
corrupt, foreign or of a newer version is one line (UserError, exit 2).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import stat
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from distdoctor.runlog import format as F

MAGIC = b"DDOCPACK"
VERSION = 1
HEAD = struct.Struct("<8sII")
ENTRY = struct.Struct("<BBHIQQ")
KIND_FILE, KIND_RING, KIND_END = 1, 2, 3
RING_META = struct.Struct("<QQQQ")  # file size, first event, events, string bytes
LEVEL = 6  # zlib's default: level 9 gains ~1% here for twice the time

# --- bounds on what a pack may make a reader do --------------------------------------
MAX_ENTRIES = 1 << 20  # 1,024 ranks x several logs, probes, stacks and sources
MAX_NAME = 512
MAX_DEPTH = 2  # a name's parts: ranks/rank-00003.ring, sources/<hash>.src
MAX_ENTRY_RAW = 1 << 30  # what one entry may inflate to (a full default log: 64 MiB)
MAX_TOTAL_RAW = 64 << 30  # what all of them may
MAX_LOG_SIZE = 16 << 30  # a log's sparse size (a 60 MiB ring by default)
MAX_OTHER_FILE = 256 << 20  # a file of the run dir other than a log, when packing
CHUNK = 1 << 20
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
# the run dir's folders (runlog/rundir.py); a pack holds their files and the top level's
RUN_DIRS = frozenset({"ranks", "probes", "stacks", "sources"})
NAME_PART = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+@=-]*\Z")


@dataclass
class PackStats:
    path: Path
    size: int = 0  # bytes of the pack
    logs: int = 0
    events: int = 0
    files: int = 0
    raw: int = 0  # bytes packed, before compression
    notes: list[str] = field(default_factory=list)


# --- writing -------------------------------------------------------------------------
class _Writer:
    def __init__(self, fh):
        self.fh, self.sha, self.count, self.size = fh, hashlib.sha256(), 0, 0

    def _put(self, data: bytes) -> None:
        self.fh.write(data)
        self.sha.update(data)
        self.size += len(data)

    def entry(self, kind: int, name: str, raw: bytes | bytearray | memoryview) -> None:
        stored = zlib.compress(raw, LEVEL)
        encoded = name.encode()
        self._put(ENTRY.pack(kind, 0, len(encoded), zlib.crc32(raw), len(raw), len(stored)))
        self._put(encoded)
        self._put(stored)
        self.count += 1

    def end(self) -> None:
        digest = self.sha.digest()
        self._put(ENTRY.pack(KIND_END, 0, 0, 0, self.count, len(digest)))
        self.fh.write(digest)
        self.size += len(digest)


def write_pack(run_dir: str | os.PathLike, out: str | os.PathLike,
               sources: bool = True) -> PackStats:
    """Pack `run_dir` into the file `out` (replaced whole: written under a fresh name,
    then renamed). `sources`: the kept copies of the job's files go in (else only their
    hashes: the reader can still tell whether the file at the path is the run's)."""
    from distdoctor.runlog import kept, rundir

    run = Path(run_dir)
    rundir.open_run_dir(run)  # a foreign or newer dir: its one line, nothing written
    out = Path(out)
    stats = PackStats(out)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        with os.fdopen(fd, "wb", buffering=CHUNK) as fh:
            w = _Writer(fh)
            w._put(HEAD.pack(MAGIC, VERSION, 0))
            files = []
            for rel, path in _run_files(run, stats):
                if rel.startswith("sources/"):
                    continue  # below: the kept sources, as the pack keeps them
                if rel.startswith("ranks/") and rel.endswith(".ring"):
                    raw, n, named = _small_log(path, stats)
                    if raw is not None:
                        w.entry(KIND_RING, rel, raw)
                        stats.logs += 1
                        stats.events += n
                        stats.raw += len(raw)
                        files += named
                        continue
                data = _read_file(path, stats, rel)
                if data is not None:
                    w.entry(KIND_FILE, rel, data)
                    stats.files += 1
                    stats.raw += len(data)
            for rel, data in kept.for_pack(run, files, sources, stats.notes):
                w.entry(KIND_FILE, rel, data)
                stats.files += 1
                stats.raw += len(data)
            w.end()
            stats.size = w.size
        os.replace(tmp, out)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return stats


def _run_files(run: Path, stats: PackStats):
    """(relative name, path) of every regular file of the run dir and of its folders, in
    a stable order; links and temp files (dot names) left out."""
    def walk(d: Path, prefix: str, depth: int):
        try:
            entries = sorted(os.scandir(d), key=lambda e: e.name)
        except OSError as exc:
            stats.notes.append(f"{d}: not read ({exc.strerror or exc})")
            return
        for e in entries:
            if e.name.startswith("."):
                continue
            if not NAME_PART.match(e.name):
                stats.notes.append(f"{prefix}{e.name!r}: a name a run dir does not make, "
                                   f"left out")
                continue
            if e.is_symlink():
                stats.notes.append(f"{prefix}{e.name}: a link, left out")
            elif e.is_dir(follow_symlinks=False):
                if depth == 0 and e.name in RUN_DIRS:
                    yield from walk(Path(e.path), f"{prefix}{e.name}/", depth + 1)
                else:
                    stats.notes.append(f"{prefix}{e.name}/: not a folder of a run dir, "
                                       f"left out")
            elif e.is_file(follow_symlinks=False):
                yield f"{prefix}{e.name}", Path(e.path)

    yield from walk(run, "", 0)


def _read_file(path: Path, stats: PackStats, rel: str) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY | _NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        stats.notes.append(f"{rel}: not read ({exc.strerror or exc})")
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        if st.st_size > MAX_OTHER_FILE:
            stats.notes.append(f"{rel}: {st.st_size} bytes, over the {MAX_OTHER_FILE >> 20} "
                               f"MiB a file may be: left out")
            return None
        with os.fdopen(os.dup(fd), "rb") as fh:
            return fh.read(MAX_OTHER_FILE)
    finally:
        os.close(fd)


def _small_log(path: Path, stats: PackStats):
    """(a RING entry's raw bytes, events, the call sites' files named in its strings), or
    (None, 0, []) for a file that is not a whole log (packed as a plain file then)."""
    from distdoctor.privatefiles import open_regular
    from distdoctor.runlog.values import READ_BYTES, READ_SLOTS, is_zeros

    try:
        fd, st = open_regular(path)  # (a FIFO put there since the listing: refused)
    except OSError:
        return None, 0, []
    try:
        size = st.st_size
        head = os.pread(fd, F.HEADER_SIZE, 0)
        layout = layout_of(head, size)
        if layout is None:
            stats.notes.append(f"{path.name}: not a whole event log; packed as it is")
            return None, 0, []
        capacity, s_off, s_size, r_off, full = layout
        used = min(F.U64.unpack_from(head, F.OFF_STRINGS_USED)[0], s_size)
        strings = bytearray()
        while len(strings) < used:  # a piece at a time, as the slots below
            piece = os.pread(fd, min(READ_BYTES, used - len(strings)), s_off + len(strings))
            if not piece or is_zeros(piece):  # no table holds a piece of zeros: a
                stats.notes.append(f"{path.name}: its header counts strings its table "
                                   f"does not hold; packed as it is")  # crafted `used`
                return None, 0, []
            strings += piece
        n_head = F.U64.unpack_from(head, F.OFF_HEAD)[0]
        first = max(0, n_head - capacity)
        n = n_head - first
        slots = bytearray()
        e = first
        while e < n_head:  # the ring may wrap: two stretches, each read a piece at a time
            slot = e % capacity
            k = min(n_head - e, capacity - slot, READ_SLOTS)
            piece = os.pread(fd, k * F.SLOT_SIZE, r_off + slot * F.SLOT_SIZE)
            if len(piece) != k * F.SLOT_SIZE:
                stats.notes.append(f"{path.name}: shorter than its header says; packed as "
                                   f"it is")
                return None, 0, []
            if is_zeros(piece):  # slots never written where its head says events are (a
                stats.notes.append(f"{path.name}: its header counts events its ring does "
                                   f"not hold; packed as it is")  # crafted head over a
                return None, 0, []  # sparse 2 GiB): never held whole
            slots += piece
            e += k
        if len(strings) != used:
            stats.notes.append(f"{path.name}: shorter than its header says; packed as it is")
            return None, 0, []
    finally:
        os.close(fd)
    raw = bytearray(RING_META.pack(full, first, n, used))
    raw += head
    raw += strings
    raw += _columns(slots, n)
    return raw, n, _files_named(strings)


def layout_of(head: bytes, size: int):
    """(capacity, strings offset, strings size, ring offset, file size) of a log header
    that is ours, whole and of a version this reader knows; else None."""
    if len(head) < F.HEADER_SIZE:
        return None
    (magic, version, header_size, slot_size, capacity, s_off, s_size, r_off, _rank,
     _pid) = F.HEADER_STATIC.unpack_from(head, 0)
    full = r_off + capacity * slot_size
    if (magic != F.MAGIC or not 0 < version <= F.VERSION or header_size != F.HEADER_SIZE
            or slot_size != F.SLOT_SIZE or s_off != F.HEADER_SIZE or capacity < 1
            or r_off != s_off + s_size or full > MAX_LOG_SIZE or size < full):
        return None
    return capacity, s_off, s_size, r_off, full


def _columns(slots: bytes | bytearray, n: int) -> bytes:
    """The slots byte-column by byte-column (see the module's docstring)."""
    view = bytes(slots)
    return b"".join(view[j::F.SLOT_SIZE] for j in range(F.SLOT_SIZE)) if n else b""


def _files_named(strings: bytes) -> list[str]:
    """The files the log's call sites name (its strings that are call sites)."""
    import json

    from distdoctor.runlog.sources import files_of

    out: list[str] = []
    at, end = 0, len(strings)
    while at + 4 <= end:
        (n,) = F.STRING_LEN.unpack_from(strings, at)
        start = at + 4
        if start + n > end:
            break
        chunk = strings[start:start + n]
        at = start + n
        if b'"file"' not in chunk or b'"line"' not in chunk:
            continue
        try:
            out += files_of(json.loads(chunk))
        except (ValueError, UnicodeDecodeError):
            continue
    return out
