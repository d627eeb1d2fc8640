"""The forwarding protocol: how a node's `distdoctor run --forward` ships its run dir to
the collector (`distdoctor watch --listen`). One TCP stream per node, one-way, made of
frames:

    24-byte header  magic b"DDFW", version u8, type u8, log u16, rank u32,
                    arg u64, length u32  (little-endian)

`log` is which of the rank's logs a log frame (META, OPEN, STRINGS, SLOTS, STATE) is
about: 0 for its first, n for `ranks/rank-NNNNN.n.ring` (the rank started again).
    payload         `length` bytes (at most MAX_PAYLOAD)

No pickle, nothing executed: payloads are JSON objects (HELLO, META, EXITS), UTF-8 JSON
lines (SAMPLES) or the rank's event-log bytes in the event log's own layout (OPEN,
STRINGS, SLOTS, STATE; see runlog/format.py). The collector checks each frame before it
writes it, and drops a connection that sends a malformed one (what came before stays).

    HELLO    first frame: {"format", "version", "host", "instance", "run": run.json's
             fields}; `instance` is random per forwarder (its reconnections carry it)
    AUTH     the node's answer to CHALLENGE: {"answer": HMAC-SHA256 under the token of
             the nonce and the host (collect/auth.py)}
    META     rank's metadata (ranks/rank-N.json, rank-N.<log>.json)
    OPEN     a rank's log appeared: capacity, string table size, pid; then its launch
             identity (JSON, as in the log's header)
    STRINGS  bytes of the rank's string table at offset `arg`
    SLOTS    whole 128-byte slots, of events `arg`, `arg + 1`, ...
    STATE    the rank's header words: head, string counts, heartbeat, and how it left
             (its CLOSED_* word, the exception's string id, the os._exit status)
    SAMPLES  the node's probe samples, whole lines
    EXITS    exit statuses of the node's ranks, as in exits.json
    FINDINGS what the node's `run` alone saw, as in findings.json: the errors in its job's
             output (the rest the collector finds itself, from all the ranks)
    DIGEST   instead of OPEN/STRINGS/SLOTS/STATE (`run --forward-digest`, for thousands of
             ranks): each rank's position and the collectives its ranks entered, one JSON
             object (collect/digest.py)
    SOURCE   a file of the node's sources/ (runlog/sources.py): its name, b"\n", its
             bytes; `manifest.json` or `<sha256>.src` only, sent only to a collector whose
             WELCOME says {"sources": 1} (collect/source_copies.py)

The token itself never travels, TLS or not: a collector with a token answers HELLO with
CHALLENGE, a fresh random nonce, and the node proves it holds the token with AUTH. A
recorded session replayed answers an old nonce and is refused. With TLS (collect/tls.py)
the same frames go inside a TLS connection, its handshake first.

and from the collector:

    CHALLENGE  the nonce (raw bytes), when the collector has a token; then AUTH is due
    WELCOME    go on; {"sources": 1}: SOURCE frames are welcome (an older collector's is
               empty, and a node sends it none)
    REFUSED    {"why"}: the connection closes (a wrong answer, another protocol version).
               To a node of an older version it goes in that version's header, so the
               node reads it and says why (upgrade the node).
"""

from __future__ import annotations

import json
import struct
from typing import NamedTuple

from distdoctor.runlog import format as F

MAGIC = b"DDFW"
VERSION = 4  # 2: DIGEST; 3: STATE says how the rank left; 4: CHALLENGE and AUTH
FORMAT = "distdoctor-forward"
FRAME = struct.Struct("<4sBBHIQI")
MAX_PAYLOAD = 4 << 20

(HELLO, META, OPEN, STRINGS, SLOTS, STATE, SAMPLES, EXITS, WELCOME, REFUSED,
 FINDINGS, DIGEST, CHALLENGE, AUTH, SOURCE) = range(1, 16)
NAMES = {HELLO: "HELLO", META: "META", OPEN: "OPEN", STRINGS: "STRINGS", SLOTS: "SLOTS",
         STATE: "STATE", SAMPLES: "SAMPLES", EXITS: "EXITS", WELCOME: "WELCOME",
         REFUSED: "REFUSED", FINDINGS: "FINDINGS", DIGEST: "DIGEST", CHALLENGE: "CHALLENGE",
         AUTH: "AUTH", SOURCE: "SOURCE"}
MAX_HELLO = 64 << 10  # HELLO and AUTH are read before the node is known: small
# The findings a FINDINGS frame carries besides those read from the job's output: a node
# that sends digests judges its stragglers itself, over the groups wholly on it
NODE_KINDS = ("straggler", "throttle")

OPEN_BODY = struct.Struct("<QQI")  # capacity (slots), string table bytes, pid
# head, strings used, strings count, strings dropped, heartbeat mono/wall ns, closed
# word, exit error string id, os._exit status (version 2 ended at the closed word)
STATE_BODY = struct.Struct("<QQQQqqBIq")
STATE_BODY_V2 = struct.Struct("<QQQQqqB")
SLOTS_PER_FRAME = MAX_PAYLOAD // F.SLOT_SIZE
# The collector's copy of a rank's log keeps its newest MIRROR_SLOTS events (4 MiB), and
# a node sends at most that many of a log it has not sent yet: a copy has no holes for a
# reader to stall on, and a collector of a thousand ranks stays within a few GiB.
MIRROR_SLOTS = 32768


class WireError(Exception):
    """A frame that is not one of ours: the connection it came on is dropped."""


MAX_LOG = (1 << 16) - 1  # a rank's logs past this many are not forwarded


def frame(kind: int, payload: bytes = b"", rank: int = 0, arg: int = 0, log: int = 0,
          version: int = VERSION) -> bytes:
    return FRAME.pack(MAGIC, version, kind, log, rank, arg, len(payload)) + payload


def json_frame(kind: int, value, rank: int = 0, log: int = 0, version: int = VERSION) -> bytes:
    return frame(kind, json.dumps(value, separators=(",", ":")).encode(), rank, log=log,
                 version=version)


class Header(NamedTuple):
    version: int
    kind: int
    log: int
    rank: int
    arg: int
    length: int


def parse_header(head: bytes, max_payload: int = MAX_PAYLOAD) -> Header:
    """A frame's header, checked (magic, version, type, length) before its payload is
    read: a peer that announces 1 GiB is dropped at its 24th byte."""
    magic, version, kind, log, rank, arg, length = FRAME.unpack(head)
    if magic != MAGIC:
        raise WireError("not a distdoctor forwarding stream")
    if version > VERSION:
        raise WireError(f"forwarding protocol version {version}; this distdoctor speaks "
                        f"up to {VERSION}: upgrade the collector")
    if kind not in NAMES:
        raise WireError(f"unknown frame type {kind}")
    if length > max_payload:
        raise WireError(f"{NAMES[kind]} frame of {length} bytes (at most {max_payload})")
    return Header(version, kind, log, rank, arg, length)


def read_frame(recv_exactly, max_payload: int = MAX_PAYLOAD
               ) -> tuple[int, int, int, bytes, int] | None:
    """(type, rank, arg, payload, log), or None at a clean end of stream.
    `recv_exactly(n)` returns n bytes, fewer only at the end of the stream."""
    head = recv_exactly(FRAME.size)
    if not head:
        return None
    if len(head) < FRAME.size:
        raise WireError("stream ended inside a frame header")
    _, kind, log, rank, arg, length = parse_header(head, max_payload)
    payload = recv_exactly(length) if length else b""
    if len(payload) < length:
        raise WireError(f"stream ended inside a {NAMES[kind]} frame")
    return kind, rank, arg, payload, log


def json_payload(kind: int, payload: bytes) -> dict:
    try:
        value = json.loads(payload)
    except (ValueError, UnicodeDecodeError):
        raise WireError(f"{NAMES[kind]} frame is not JSON") from None
    except RecursionError:  # '[' x 60,000: json's C decoder says so past ~1,000 levels
        raise WireError(f"{NAMES[kind]} frame nests too deep") from None
    if not isinstance(value, dict):
        raise WireError(f"{NAMES[kind]} frame is not a JSON object")
    return value
