"""Binary layout of a rank's event log (`ranks/rank-NNNNN.ring`), format version 1.

One file per rank, memory-mapped by the rank and written with plain memory stores, so
the kernel keeps every event of a rank that is SIGKILLed and another process can read
the file while the job runs:

    [header: 4 KiB][string table: interned JSON][ring: capacity x 128-byte slots]

* Header fields sit at fixed offsets so single fields (head, heartbeat) can be updated
  in place.
* A rank that starts again (an elastic restart, a second launch, a re-initialised default
  group) writes a new file, never the old one: `rank-00003.ring` is its first log,
  `rank-00003.1.ring` its second, and so on (see rundir). Each file is built whole under a
  temporary name and then linked into place, so a reader never meets a half-made or
  shrunk file. The header says which launch the file belongs to (`launch`, below): the
  readers group the ranks' files into incarnations of the job by it.
* The string table holds interned JSON values (groups, call sites, tensor shapes, span
  names, error texts) as `u32 length + utf-8 bytes`; an event refers to them by id
  (1-based position). It is append-only and bounded; when full, new strings map to id 0
  ("unknown") and `strings_dropped` counts them.
* Event `e` (0-based) lives in slot `e % capacity`. A slot's first word is `e + 1`,
  written after the rest of the record, so a reader never takes a half-written slot.
  Completion (status, then end time) is written into the same slot later; `t_end_ns == 0`
  means the op is still in flight.
"""

from __future__ import annotations

import struct

MAGIC = b"DDOCRING"
VERSION = 1
HEADER_SIZE = 4096
SLOT_SIZE = 128

# --- header -------------------------------------------------------------------------
# magic, version, header_size, slot_size, capacity, strings_offset, strings_size,
# ring_offset, rank, pid
HEADER_STATIC = struct.Struct("<8sIIIQQQQiI")
# Mutable header words, each at its own offset (8-byte aligned: single stores).
OFF_HEAD = 128  # u64 number of events ever written
OFF_STRINGS_USED = 136  # u64 bytes used in the string table
OFF_STRINGS_COUNT = 144  # u64 strings interned
OFF_STRINGS_DROPPED = 152  # u64 strings refused because the table was full
OFF_HEARTBEAT_MONO = 160  # i64 CLOCK_MONOTONIC ns of the last heartbeat
OFF_HEARTBEAT_WALL = 168  # i64 wall-clock ns of the last heartbeat
OFF_CLOSED = 176  # u64 CLOSED_*: how the rank left (0 while it runs)
# Written once, before the file is linked into place (zero in logs of older writers):
OFF_LOG_NUMBER = 184  # u64 which of the rank's logs this is (0: its first)
OFF_CREATED_WALL = 192  # i64 wall-clock ns when the file was made
OFF_EXIT_ERROR = 200  # u32 string id: the uncaught exception ({type, message, file, ...})
OFF_UNRECORDED = 208  # u64 events not recorded because the disk under the log was full
OFF_EXIT_CODE = 216  # i64 the status the rank passed to os._exit (with CLOSED_EXITED)
HEADER_WORDS_END = 224  # the header words a reader takes on every poll end here
OFF_LAUNCH = 256  # u32 length + JSON: what identifies the launch (store, restart count)
MAX_LAUNCH_BYTES = 1024
U64 = struct.Struct("<Q")
U32 = struct.Struct("<I")
I64 = struct.Struct("<q")

STRING_LEN = struct.Struct("<I")

# --- slots --------------------------------------------------------------------------
# index(e+1), kind, status, op, redop, flags, pad, pad16, group_id, callsite_id, seq,
# peer_or_root, tensors_id, numel_in, numel_out, t_enter_ns, t_end_ns, span_index,
# name_id, error_id
SLOT = struct.Struct("<QBBBBBBHIIQiIqqqqQII")
assert SLOT.size <= SLOT_SIZE
SLOT_BODY = struct.Struct("<BBBBBBHIIQiIqqqqQII")  # SLOT without the leading index
OFF_SLOT_STATUS = 9
OFF_SLOT_END = 64
OFF_SLOT_ERROR = 84

# kinds
KIND_COLLECTIVE = 1
KIND_P2P = 2
KIND_SPAN = 3
KIND_SAMPLE = 4  # where the main thread was, outside ops (tracer/steps.py): t_end = t_enter;
#                 numel_in: microseconds it waited for a CPU since the previous sample
KINDS = {KIND_COLLECTIVE: "collective", KIND_P2P: "p2p", KIND_SPAN: "span",
         KIND_SAMPLE: "sample"}

# status
STATUS_IN_FLIGHT = 0
STATUS_OK = 1
STATUS_ERROR = 2
STATUS_TIMEOUT = 3
STATUSES = {STATUS_IN_FLIGHT: "in_flight", STATUS_OK: "ok", STATUS_ERROR: "error",
            STATUS_TIMEOUT: "timeout"}

CLOSED_NORMALLY = 1  # the interpreter ran its exit hooks (exit status unknown)
CLOSED_RAISED = 2  # an uncaught exception ended it (OFF_EXIT_ERROR says which)
CLOSED_EXITED = 3  # it left through os._exit or sys.exit; OFF_EXIT_CODE: the status,
#                   OFF_EXIT_ERROR: the call's line ({type, code, file, ...}), 0 if unknown
CLOSED_WORDS = (CLOSED_NORMALLY, CLOSED_RAISED, CLOSED_EXITED)

# flags
FLAG_ASYNC = 1  # the caller asked for async_op=True (or a C++ caller: DDP, funcol)
FLAG_OTHER_THREAD = 2  # issued off the main thread (autograd, pipelining)
FLAG_ASYNC_UNKNOWN = 4  # issued from C++ or by a library: async flag not visible
FLAG_IMPLICIT = 8  # a span the tracer opened itself (a training step, a batch wait)
# the implicit span around the creation of a process group (new_group, new_subgroups,
# DeviceMesh): its group fields are the new group's name and members, on every rank that
# took part, member or not; torch names a group by a per-rank counter, so the ranks' lists
# of these say whether they created their groups in one order
SPAN_NEW_GROUP = "new_group"

# op codes: position in this list. Append only: the code is part of the format.
OPS = [
    "unknown",
    "all_reduce",
    "all_reduce_coalesced",
    "broadcast",
    "reduce",
    "all_gather",
    "all_gather_coalesced",
    "all_gather_into_tensor",
    "all_gather_into_tensor_coalesced",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce_scatter_tensor_coalesced",
    "all_to_all",
    "all_to_all_single",
    "gather",
    "scatter",
    "barrier",
    "monitored_barrier",
    "send",
    "recv",
    "recv_anysource",
    "span",
    "sample",
    "gather_into_tensor",  # torch >= 2.15's gather_single
]
OP_CODE = {name: i for i, name in enumerate(OPS)}

# torch's ReduceOp.RedOpType values, by name
REDUCE_OPS = ["sum", "avg", "product", "min", "max", "band", "bor", "bxor", "premul_sum"]
REDOP_NONE = 255
