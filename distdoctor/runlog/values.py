"""What a log's values must be to be taken: a log is written by a rank, copied from
another node or crafted, so each string-table value is checked before the reader uses it
(a group's ranks, a tensor's dims, a name), and pieces of zeros (slots never written, a
sparse file's holes) are told apart without decoding them."""

from __future__ import annotations

import json

from distdoctor.runlog import format as F

READ_SLOTS = 8192  # slots a pread takes at most (1 MiB)
READ_BYTES = READ_SLOTS * F.SLOT_SIZE

MAX_LIST = 1 << 18  # ranks of a group (a job of 262,144 GPUs), tensors of an op
MAX_RANK = 1 << 24


def rank_list(value) -> bool:
    return (isinstance(value, list) and len(value) <= MAX_LIST
            and all(type(r) is int and 0 <= r < MAX_RANK for r in value))


def shape(value) -> bool:
    """A tensor's dims: sizes, or the names of symbolic ones (written with str())."""
    return (isinstance(value, list) and len(value) <= 64
            and all((type(d) is int and 0 <= d < 1 << 63) or (isinstance(d, str)
                                                             and len(d) <= 64)
                    for d in value))


ZEROS = bytes(READ_BYTES)


def is_zeros(data: bytes) -> bool:
    """Whether `data` (READ_BYTES at most) is all zeros: a memcmp, no copy."""
    return ZEROS.startswith(data)


def text(value, limit: int | None = None) -> str | None:
    """A name or error string (a corrupt log's id may point at another kind of value)."""
    out = value if isinstance(value, str) or value is None else str(value)
    return out if limit is None or out is None or len(out) <= limit else out[:limit]


def launch_of(head: bytes) -> dict:
    """The header's launch identity ({} in an older writer's log, or one not readable)."""
    (n,) = F.U32.unpack_from(head, F.OFF_LAUNCH)
    if not 0 < n <= F.MAX_LAUNCH_BYTES:
        return {}
    try:
        value = json.loads(head[F.OFF_LAUNCH + 4:F.OFF_LAUNCH + 4 + n])
    except (ValueError, UnicodeDecodeError):
        return {}
    return value if isinstance(value, dict) else {}


# a slot's codes in words, memoized by their five bytes as one word (code_word): every
# event a reader takes is looked up there, by the C decoder too (runlog/_decode.c)
decoded_codes: dict[int, tuple] = {}


def code_word(kind, op, status, redop, flags) -> int:
    """A slot's five code bytes as one word: the key of decoded_codes (_decode.c builds it
    alike)."""
    return kind | op << 8 | status << 16 | redop << 24 | flags << 32


def decode_codes(kind, op, status, redop, flags) -> tuple:
    """(kind, op, status, reduce op, is_async, other_thread, implicit) of a slot's codes;
    few distinct combinations occur, so each is decoded once."""
    out = (F.KINDS.get(kind, "unknown"), F.OPS[op] if op < len(F.OPS) else "unknown",
           F.STATUSES.get(status, "unknown"),
           F.REDUCE_OPS[redop] if redop < len(F.REDUCE_OPS) else None,
           None if flags & F.FLAG_ASYNC_UNKNOWN else bool(flags & F.FLAG_ASYNC),
           bool(flags & F.FLAG_OTHER_THREAD), bool(flags & F.FLAG_IMPLICIT))
    if len(decoded_codes) < 4096:  # bounded even for a corrupt log's random codes
        decoded_codes[code_word(kind, op, status, redop, flags)] = out
    return out
