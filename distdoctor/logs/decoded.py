"""A log file's bytes as the reader wants them: UTF-8 text, whatever the file was saved as.

- gzip (by its magic bytes): inflated piece by piece with zlib (`decompressobj(31)`, the
  gzip wrapper), a bounded piece at a time however well the data compresses. A stream cut
  short (a .gz still being written, a copy that stopped) gives every byte it holds and then
  says so in `damage`; corrupt data gives what came before it and says where. (gzip.GzipFile
  raised EOFError or zlib.error instead, losing what the last read had inflated.)
- UTF-16 (a byte-order mark, or NULs between ASCII letters: PowerShell's `>` and Windows
  editors save logs so) and UTF-32 (its mark): decoded, written back as UTF-8. Undecodable
  bytes become U+FFFD, as everywhere in the reader.
- A UTF-8 byte-order mark is dropped (it hid the first line's prefix).

Everything else is the plain file, seekable, untouched. The streams here are read only
forward: `read`, `readline`, iteration by lines, `peek`.
"""

from __future__ import annotations

import codecs
import zlib

GZIP_MAGIC = b"\x1f\x8b"
SNIFF = 4096  # bytes looked at to tell the encoding
PIECE = 1 << 20  # bytes read, and most bytes inflated, at a time
_BOMS = ((codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"),
         (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))


def open_log(path: str):
    """`path` for binary reading, as UTF-8 text whatever its compression and encoding. What
    went wrong inflating it is the stream's `damage` once read (None: nothing)."""
    fh = open(path, "rb")
    head = fh.read(SNIFF)
    fh.seek(0)
    stream = fh
    if head[:2] == GZIP_MAGIC:
        stream = _Gunzipped(fh)
        head = stream.peek(SNIFF)
    encoding = text_encoding(head)
    if encoding == "utf-8-sig" and stream is fh:
        fh.seek(len(codecs.BOM_UTF8))  # (still seekable: the tail is read from its end)
    elif encoding == "utf-8-sig":
        stream = _Skipped(stream, len(codecs.BOM_UTF8))
    elif encoding is not None:
        stream = _Transcoded(stream, encoding)
    return stream


def text_encoding(head: bytes) -> str | None:
    """The encoding the first bytes of a file show where it is not UTF-8 (or ASCII): "utf-16"
    or "utf-32" by their mark, "utf-16-le"/"utf-16-be" by NULs every other byte, "utf-8-sig"
    for UTF-8 with a mark; else None."""
    for bom, name in _BOMS:
        if head.startswith(bom):
            return name
    if head.startswith(codecs.BOM_UTF8):
        return "utf-8-sig"
    pairs = len(head) // 2
    if pairs < 8:
        return None
    odd, even = head[1:2 * pairs:2].count(0), head[0:2 * pairs:2].count(0)
    if odd >= 0.4 * pairs and even <= 0.05 * pairs:  # "a\0b\0": ASCII in UTF-16-LE
        return "utf-16-le"
    if even >= 0.4 * pairs and odd <= 0.05 * pairs:
        return "utf-16-be"
    return None


class _Stream:
    """Forward reads over the pieces `_more()` returns (b"" at the end)."""

    damage: str | None = None

    def __init__(self, raw):
        self._raw = raw
        self._buf = b""
        self._pos = 0
        self._ended = False

    def _more(self) -> bytes:
        raise NotImplementedError

    def _fill(self, n: int) -> bool:
        """At least `n` bytes buffered past the position, or all there are; False at the
        end with nothing buffered."""
        pieces = [self._buf[self._pos:]]
        have = len(pieces[0])
        while have < n and not self._ended:
            piece = self._more()
            if not piece:
                self._ended = True
                break
            pieces.append(piece)
            have += len(piece)
        self._buf, self._pos = b"".join(pieces), 0
        return have > 0

    def peek(self, n: int) -> bytes:
        self._fill(n)
        return self._buf[self._pos:self._pos + n]

    def read(self, n: int = -1) -> bytes:
        want = (1 << 62) if n is None or n < 0 else n
        if len(self._buf) - self._pos < want:
            self._fill(want)
        out = self._buf[self._pos:self._pos + want]
        self._pos += len(out)
        return out

    def readline(self, limit: int = -1) -> bytes:
        limit = (1 << 62) if limit is None or limit < 0 else limit
        searched = self._pos  # no newline before this
        while True:
            stop = min(len(self._buf), self._pos + limit)
            nl = self._buf.find(b"\n", searched, stop)
            if nl >= 0:
                end = nl + 1
                break
            if stop - self._pos >= limit or self._ended:
                end = stop
                break
            searched = len(self._buf) - self._pos
            self._fill(searched + PIECE)  # (the position is 0 after it)
        out = self._buf[self._pos:end]
        self._pos = end
        return out

    def __iter__(self):
        while line := self.readline():
            yield line

    def seekable(self) -> bool:
        return False

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        self._raw.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _Gunzipped(_Stream):
    """A gzip file inflated (each member of one made of several), what it holds kept
    when it is cut short or corrupt."""

    def __init__(self, raw):
        super().__init__(raw)
        self._inflate = zlib.decompressobj(31)
        self._out = 0  # bytes inflated
        self._done = False

    def _more(self) -> bytes:
        while not self._done:
            d = self._inflate
            if d.unconsumed_tail:
                data = d.unconsumed_tail
            elif d.eof:  # a member ended: another may follow (cat a.gz b.gz)
                data = d.unused_data
                if len(data) < 2:
                    data += self._raw.read(PIECE)
                if data[:2] != GZIP_MAGIC:  # the end, or padding after it: not the log's
                    self._done = True
                    break
                d = self._inflate = zlib.decompressobj(31)
            else:
                data = self._raw.read(PIECE)
                if not data:
                    self._done = True
                    self.damage = (f"the gzip data ends early (cut short after "
                                   f"{self._out:,} bytes of text)")
                    return d.flush()
            before = d.copy()  # (a few KiB: the state to go back to if this piece is corrupt)
            try:
                out = d.decompress(data, PIECE)
            except zlib.error as exc:
                out = _salvage(before, data)
                self._done = True
                self._out += len(out)
                self.damage = (f"corrupt gzip data after {self._out:,} bytes of text "
                               f"({_zlib_words(exc)})")
                return out
            if out:
                self._out += len(out)
                return out
        return b""


def _salvage(inflate, data: bytes, step: int = 64, most: int = 16 * PIECE) -> bytes:
    """What `data` inflates to before the corrupt byte zlib stops at, fed a few bytes at a
    time (fed whole, the error loses the call's output: the CRC at a member's end is
    checked after every byte of it was inflated)."""
    out: list[bytes] = []
    have = 0
    try:
        for i in range(0, len(data), step):
            piece = inflate.decompress(data[i:i + step], most - have)
            out.append(piece)
            have += len(piece)
            if have >= most or inflate.eof:
                break
    except zlib.error:
        pass
    return b"".join(out)


def _zlib_words(exc: zlib.error) -> str:
    """zlib's reason without its numbers ("Error -3 while decompressing data: invalid
    stored block lengths" -> "invalid stored block lengths")."""
    return str(exc).rsplit(": ", 1)[-1]


class _Transcoded(_Stream):
    """Text of another encoding, as UTF-8."""

    def __init__(self, raw, encoding: str):
        super().__init__(raw)
        self._decode = codecs.getincrementaldecoder(encoding)("replace").decode

    def _more(self) -> bytes:
        while True:
            data = self._raw.read(PIECE)
            text = self._decode(data, final=not data)
            if text or not data:
                return text.encode("utf-8", "surrogatepass")

    @property
    def damage(self) -> str | None:  # the inner stream's (a gzip of UTF-16)
        return getattr(self._raw, "damage", None)


class _Skipped(_Stream):
    """A stream less its first `n` bytes."""

    def __init__(self, raw, n: int):
        super().__init__(raw)
        self._skip = n

    def _more(self) -> bytes:
        data = self._raw.read(PIECE)
        if self._skip:
            data, self._skip = data[self._skip:], 0
        return data

    @property
    def damage(self) -> str | None:
        return getattr(self._raw, "damage", None)
