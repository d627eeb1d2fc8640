"""A pack read back (runlog/pack.py has the format): the run dir made again in a private
temp dir, every file with O_EXCL | O_NOFOLLOW, each log sparse at its size.

Bounded whatever the pack says: entries (MAX_ENTRIES), names (relative, plain parts, in
a run dir's folders), what an entry inflates to (its stated size, checked as it
inflates, MAX_ENTRY_RAW at most) and all of them (MAX_TOTAL_RAW), a log's sparse size
(MAX_LOG_SIZE), the temp dir's disk (a share of it left free), memory (an entry is
written as it inflates, never held whole); a log entry's header is judged from its first
bytes, and must say what the entry carries. Each
entry's CRC-32 and the trailer's SHA-256 of the whole file are checked before the run dir
is handed over. A pack that is truncated, corrupt, foreign or
of a newer version is one line (UserError, exit 2).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import mmap
import os
import shutil
import stat
import tempfile
import zlib
from pathlib import Path

from distdoctor.errors import UserError
from distdoctor.runlog import format as F
from distdoctor.runlog import pack as P
from distdoctor.runlog import rundir

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
# The run dirs unpacked now in this process: each spelling of the temp dir (as made, and
# with its links resolved) -> the pack's name as the user gave it (see shown())
_SHOWN: dict[str, str] = {}

def is_pack(path: str | os.PathLike) -> bool:
    """Whether `path` names a regular file (a run dir is a directory): read as a pack."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (OSError, ValueError):
        return False


class _Reader:
    def __init__(self, fh, name: str, size: int):
        self.fh, self.name, self.size = fh, name, size
        self.sha, self.at = hashlib.sha256(), 0

    def bad(self, why: str) -> UserError:
        return UserError(f"{self.name} is a damaged distdoctor pack ({why}); pack the run "
                         f"dir again")

    def take(self, n: int, hashed: bool = True) -> bytes:
        if n > self.size - self.at:
            raise UserError(f"{self.name} is a truncated distdoctor pack ({self.size} "
                            f"bytes; an entry runs past its end): copy it again")
        data = self.fh.read(n)
        if len(data) != n:
            raise UserError(f"{self.name} is a truncated distdoctor pack (it shrank while "
                            f"read)")
        if hashed:
            self.sha.update(data)
        self.at += n
        return data

    def inflate(self, stored_len: int, raw_len: int, sink) -> int:
        """Inflate `stored_len` bytes into `sink` (a callable), never more than `raw_len`
        bytes out; the CRC-32 of what came out."""
        z = zlib.decompressobj()
        crc, out, left = 0, 0, stored_len
        try:
            while left or z.unconsumed_tail:
                data = z.unconsumed_tail or self.take(min(P.CHUNK, left))
                if not z.unconsumed_tail:
                    left -= len(data)
                piece = z.decompress(data, P.CHUNK)
                out += len(piece)
                if out > raw_len:
                    raise self.bad("an entry inflates past its stated size")
                crc = zlib.crc32(piece, crc)
                sink(piece)
            piece = z.flush()
        except zlib.error:
            raise self.bad("an entry does not inflate") from None
        out += len(piece)
        if out > raw_len:
            raise self.bad("an entry inflates past its stated size")
        crc = zlib.crc32(piece, crc)
        sink(piece)
        if out != raw_len or not z.eof:
            raise self.bad("an entry is shorter than its stated size")
        return crc


def _check_name(name: str) -> str:
    parts = name.split("/")
    if (not 0 < len(parts) <= P.MAX_DEPTH or not all(P.NAME_PART.match(p) for p in parts)
            or (len(parts) > 1 and parts[0] not in P.RUN_DIRS)):
        raise UserError(f"refused: an entry named {name[:80]!r} (not a run dir's file)")
    return name


def unpack(pack: str | os.PathLike, dest: str | os.PathLike) -> int:
    """Make the run dir of `pack` in `dest` (an empty private dir of ours); the entries
    made. UserError (one line) on a pack that is not whole, ours, or of this version."""
    pack = Path(pack)
    name = str(pack)
    try:
        fd = os.open(pack, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as exc:
        raise UserError(f"cannot read {name}: {exc.strerror or exc}") from None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise UserError(f"{name} is neither a run directory nor a distdoctor pack")
        r = _Reader(fh, name, st.st_size)
        head = fh.read(P.HEAD.size)
        if len(head) < len(P.MAGIC) and P.MAGIC.startswith(head):
            raise UserError(f"{name} is a truncated distdoctor pack ({st.st_size} bytes)"
                            if head else f"{name} is an empty file, not a distdoctor pack")
        if head[:len(P.MAGIC)] != P.MAGIC:
            raise UserError(f"{name} is neither a run directory nor a distdoctor pack "
                            f"(it does not start with {P.MAGIC.decode()})")
        if len(head) < P.HEAD.size:
            raise UserError(f"{name} is a truncated distdoctor pack ({st.st_size} bytes)")
        _, version, _flags = P.HEAD.unpack(head)
        if version > P.VERSION or version < 1:
            raise UserError(f"{name} is a distdoctor pack of format version {version}; "
                            f"this distdoctor reads up to {P.VERSION}: upgrade distdoctor")
        r.sha.update(head)
        r.at = P.HEAD.size
        total = count = 0
        while True:
            eh = r.take(P.ENTRY.size, hashed=False)
            kind, _zero, name_len, crc, raw_len, stored_len = P.ENTRY.unpack(eh)
            if kind == P.KIND_END:
                digest = r.take(32, hashed=False)
                if stored_len != 32 or raw_len != count or digest != r.sha.digest():
                    raise r.bad("its checksum does not match")
                if r.at != r.size:
                    raise r.bad("bytes after its end")
                return count
            r.sha.update(eh)
            if kind not in (P.KIND_FILE, P.KIND_RING) or name_len > P.MAX_NAME or _zero:
                raise r.bad(f"an entry of unknown kind {kind}")
            if count >= P.MAX_ENTRIES:
                raise r.bad(f"more than {P.MAX_ENTRIES} entries")
            if raw_len > P.MAX_ENTRY_RAW or total + raw_len > P.MAX_TOTAL_RAW:
                raise r.bad("an entry larger than a run dir's file may be")
            if stored_len > r.size - r.at:
                raise UserError(f"{name} is a truncated distdoctor pack ({st.st_size} "
                                f"bytes; an entry runs past its end): copy it again")
            try:
                rel = _check_name(r.take(name_len).decode())
            except UnicodeDecodeError:
                raise r.bad("an entry's name is not text") from None
            total += raw_len
            count += 1
            _check_room(dest, raw_len, name)
            if kind == P.KIND_FILE:
                _unpack_file(r, Path(dest), rel, stored_len, raw_len, crc)
            else:
                _unpack_log(r, Path(dest), rel, stored_len, raw_len, crc)


# What unpacking leaves free on the temp dir's disk: a pack inflates 1,000 times at most
# (zlib), so a small one can ask for all of it (a 3 MB pack wrote 3 GiB)
KEEP_FREE_SHARE = 0.1
KEEP_FREE_MIN = 1 << 30


def _check_room(dest, raw_len: int, name: str) -> None:
    try:
        st = os.statvfs(dest)
    except OSError:
        return
    free, size = st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize
    if raw_len > free - max(KEEP_FREE_MIN, int(KEEP_FREE_SHARE * size)):
        raise UserError(f"cannot unpack {name}: an entry of {raw_len >> 20} MiB would fill "
                        f"the temp dir's disk ({free >> 20} MiB free; set TMPDIR to a larger "
                        "one)")


def _create(dest: Path, rel: str, mode: int = os.O_WRONLY) -> int:
    parent = dest
    for part in rel.split("/")[:-1]:
        parent = parent / part
        try:
            os.mkdir(parent, 0o700)
        except FileExistsError:
            if not stat.S_ISDIR(os.lstat(parent).st_mode):
                raise UserError(f"refused: {rel} (its folder is a file)") from None
    try:
        return os.open(dest / rel, mode | os.O_CREAT | os.O_EXCL | _NOFOLLOW | os.O_CLOEXEC,
                       0o600)
    except (FileExistsError, IsADirectoryError):
        raise UserError(f"refused: {rel} twice in the pack") from None


def _unpack_file(r: _Reader, dest: Path, rel: str, stored_len, raw_len, crc) -> None:
    fd = _create(dest, rel)
    with os.fdopen(fd, "wb") as out:
        got = r.inflate(stored_len, raw_len, out.write)
    if got != crc:
        raise r.bad(f"{rel} does not match its checksum")


def _unpack_log(r: _Reader, dest: Path, rel: str, stored_len, raw_len, crc) -> None:
    parsed = rundir.parse_log_name(rel[len("ranks/"):]) if rel.startswith("ranks/") else None
    if parsed is None or parsed[2] != "ring":  # (a log under run.json's name was read whole)
        raise r.bad(f"a log named {rel}, not a rank's log")
    log = _LogWriter(r, dest, rel, raw_len, parsed[0])
    try:
        got = r.inflate(stored_len, raw_len, log.take)
    finally:
        log.close()
    if got != crc:
        raise r.bad(f"{rel} does not match its checksum")
    if log.meta is None:
        raise r.bad(f"{rel} is too short for a log")


class _LogWriter:
    """A log entry as it inflates, written into its sparse file as it comes. Its header is
    judged from its first bytes, before the rest is taken in (a 1 GiB entry of zeros was
    held whole before its header was read): what it says must be what the entry carries,
    as pack.py writes it (its string bytes, the events since the oldest the ring still
    holds, the rank its name says; a string table the entry did not carry was read from
    zeros for minutes). Then the string bytes and each byte column of the events go to
    their places (the columns through a map of the ring: byte j of every slot), so an
    entry is never held whole (a valid 1 GiB one took 2 GB: the entry, then its rows)."""

    def __init__(self, r: _Reader, dest: Path, rel: str, raw_len: int, rank: int):
        self.r, self.dest, self.rel, self.raw_len, self.rank = r, dest, rel, raw_len, rank
        self.head: bytearray | None = bytearray()
        self.meta: tuple | None = None
        self.fd: int | None = None
        self.ring: mmap.mmap | None = None
        self.ring_at = 0  # where slot 0 starts in the map
        self.pos = 0  # bytes put after the header

    def take(self, piece: bytes) -> None:
        if self.meta is None:
            self.head += piece
            need = P.RING_META.size + F.HEADER_SIZE
            if len(self.head) < need:
                return
            self.meta = self._judge()
            self._open()
            piece, self.head = bytes(self.head[need:]), None
        self._put(memoryview(piece))

    def close(self) -> None:
        if self.ring is not None:
            self.ring.close()
        if self.fd is not None:
            os.close(self.fd)
        self.ring = self.fd = None

    def _open(self) -> None:
        full, _first, n, _used, at, layout = self.meta
        capacity, _s_off, _s_size, r_off, _ = layout
        self.fd = _create(self.dest, self.rel, os.O_RDWR)
        os.ftruncate(self.fd, full)  # sparse, as the rank's own
        os.pwrite(self.fd, bytes(self.head[P.RING_META.size:at]), 0)
        if n:
            start = r_off - r_off % mmap.ALLOCATIONGRANULARITY
            self.ring = mmap.mmap(self.fd, r_off + capacity * F.SLOT_SIZE - start,
                                  offset=start)
            self.ring_at = r_off - start

    def _put(self, data: memoryview) -> None:
        _full, first, n, used, _at, layout = self.meta
        capacity, s_off = layout[0], layout[1]
        while data:
            if self.pos < used:  # the string table's bytes
                k = min(len(data), used - self.pos)
                os.pwrite(self.fd, data[:k], s_off + self.pos)
            else:  # byte `column` of the events from the i-th oldest on
                column, i = divmod(self.pos - used, n)
                k = min(len(data), n - i)
                done = 0
                while done < k:  # the ring may wrap: two runs of slots
                    slot = (first + i + done) % capacity
                    m = min(k - done, capacity - slot)
                    at = self.ring_at + slot * F.SLOT_SIZE + column
                    self.ring[at:at + m * F.SLOT_SIZE:F.SLOT_SIZE] = data[done:done + m]
                    done += m
            data = data[k:]
            self.pos += k

    def _judge(self) -> tuple:
        buf, bad = self.head, self.r.bad
        full, first, n, used = P.RING_META.unpack_from(buf, 0)
        at = P.RING_META.size + F.HEADER_SIZE
        head = bytes(buf[P.RING_META.size:at])
        layout = P.layout_of(head, full)
        if layout is None or layout[-1] != full:
            raise bad(f"{self.rel} holds no log this distdoctor reads")
        capacity = layout[0]
        n_head = F.U64.unpack_from(head, F.OFF_HEAD)[0]
        if (used > layout[2] or used != F.U64.unpack_from(head, F.OFF_STRINGS_USED)[0]
                or first != max(0, n_head - capacity) or n != n_head - first
                or self.raw_len != at + used + n * F.SLOT_SIZE):
            raise bad(f"{self.rel}'s parts do not add up")
        if F.HEADER_STATIC.unpack_from(head, 0)[8] != self.rank:
            raise bad(f"{self.rel} holds another rank's log")
        return full, first, n, used, at, layout


def shown(text: str | os.PathLike, quote=None) -> str:
    """`text` as the user is told it: a path in (or of) a pack's unpacked run dir is named
    by the pack (`run.ddpack/exits.json`), never by the private temp dir it lies in.
    `quote`: how the name is written into `text` (JSON's escapes, rich's markup...)."""
    text = str(text)
    for tmp, name in _SHOWN.items():
        if tmp in text:
            text = text.replace(tmp, quote(name) if quote else name)
    return text


def in_json(name: str) -> str:
    """`name` as it goes inside a JSON string."""
    return json.dumps(name)[1:-1]


@contextlib.contextmanager
def unpacked(pack: str | os.PathLike):
    """The run dir of `pack`, made in a private temp dir that is removed after, also when
    SIGTERM or SIGHUP ends the command. While it lives, shown() names it, and what lies in
    it, by `pack` as given."""
    from distdoctor.termination import ends_through_finally, termination_held

    dest, spellings = None, ()
    with ends_through_finally():
        try:
            # a signal between making and naming it would leave it behind; the name is
            # short: a line that quotes a path in it keeps it whole. 0700, ours
            with termination_held():
                dest = tempfile.mkdtemp(prefix="ddpack-")
            spellings = {dest, os.path.realpath(dest)}
            for tmp in spellings:
                _SHOWN[tmp] = str(pack)
            try:
                unpack(pack, dest)
            except OSError as exc:
                raise UserError(f"cannot unpack {pack}: {exc.strerror or exc}") from None
            yield Path(dest)
        finally:
            with termination_held():  # (a signal amid the removal: the rest left behind)
                if dest is not None:
                    shutil.rmtree(dest, ignore_errors=True)
                for tmp in spellings:
                    _SHOWN.pop(tmp, None)
