"""What a node sends besides its logs, checked and bounded before the collector keeps any
of it (limits.py): its findings (kept, written to findings.json and printed: their text
made printable, their sizes bounded) and its exit codes (exits.json's entries, checked as
every reader of that file checks them). A frame that fails is refused whole (WireError:
the node is dropped with one line)."""

from __future__ import annotations

import json

from distdoctor.collect import wire
from distdoctor.collect.limits import (
    MAX_CALLSITES,
    MAX_DETAILS_BYTES,
    MAX_FINDINGS_PER_FRAME,
    MAX_RANK,
    MAX_RANKS_PER_NODE,
    MAX_SHORT_TEXT,
    MAX_STACK_TEXT,
    MAX_STACKS,
    MAX_TEXT,
)
from distdoctor.collect.peer_numbers import is_int, kept_number
from distdoctor.exits import exit_entry
from distdoctor.safetext import printable

SEVERITIES = ("error", "warning", "info")
_MAX_DEPTH = 8


def node_findings(payload: bytes) -> list:
    """A FINDINGS frame's findings that came from the job's output, and (from a node that
    sends digests) its stragglers (a node's own engine saw only its own ranks: its other
    findings are the collector's to make); each one's text printable and bounded."""
    items = wire.json_payload(wire.FINDINGS, payload).get("findings")
    if not isinstance(items, list):
        raise wire.WireError("FINDINGS frame has no list of findings")
    found = [finding_of(d) for d in items[:MAX_FINDINGS_PER_FRAME]]
    return [f for f in found if f.details.get("source") == "log" or f.kind in wire.NODE_KINDS]


def finding_of(d):
    """A finding a node sent, rebuilt from checked, bounded, printable parts."""
    from distdoctor.findings import Finding

    if not isinstance(d, dict):
        raise wire.WireError("FINDINGS frame holds something that is not a finding")
    kind, severity, summary = d.get("kind"), d.get("severity"), d.get("summary")
    ranks, seq = d.get("ranks") or [], d.get("seq")
    if not (isinstance(kind, str) and severity in SEVERITIES and isinstance(summary, str)
            and isinstance(ranks, list) and len(ranks) <= MAX_RANKS_PER_NODE * 64
            and all(is_int(r, 0, MAX_RANK) for r in ranks) and (seq is None or is_int(seq))):
        raise wire.WireError("FINDINGS frame holds something that is not a finding")
    details = d.get("details") or {}
    if not isinstance(details, dict) or _json_size(details) > MAX_DETAILS_BYTES:
        raise wire.WireError(f"FINDINGS frame holds a finding whose details are not an "
                             f"object of at most {MAX_DETAILS_BYTES:,} bytes")
    callsites, stacks = d.get("callsites") or [], d.get("stacks") or {}
    if not (isinstance(callsites, list) and isinstance(stacks, dict)
            and all(isinstance(c, dict) for c in callsites)):
        raise wire.WireError("FINDINGS frame holds a finding with malformed call sites")
    group, remedy = d.get("group"), d.get("remedy")
    return Finding(
        kind=printable(kind, 32), severity=severity, summary=printable(summary, MAX_TEXT),
        ranks=list(ranks), group=None if group is None else printable(group, MAX_SHORT_TEXT),
        seq=seq, callsites=[clean(c) for c in callsites[:MAX_CALLSITES]],
        stacks={printable(k, 32): printable(v, MAX_STACK_TEXT, keep_newlines=True)
                for k, v in list(stacks.items())[:MAX_STACKS]},
        details=clean(details),
        remedy=None if remedy is None else printable(remedy, MAX_TEXT, keep_newlines=True))


def clean(value, depth: int = 0):
    """A JSON value with every string in it made printable (newlines kept) and bounded,
    every number one any reader takes (peer_numbers.kept_number: no bare Infinity or NaN
    in findings.json, no 400-digit int); nesting past _MAX_DEPTH is cut (a node's details
    are a few levels deep)."""
    if isinstance(value, str):
        return printable(value, MAX_TEXT, keep_newlines=True)
    if isinstance(value, dict):
        if depth >= _MAX_DEPTH:
            return {}
        return {printable(k, MAX_SHORT_TEXT): clean(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [] if depth >= _MAX_DEPTH else [clean(v, depth + 1) for v in value]
    return kept_number(value)


def node_exits(payload: bytes) -> list[dict]:
    """An EXITS frame's process entries, each checked (distdoctor.exits.exit_entry) and
    naming a rank; at most a node's worth."""
    processes = wire.json_payload(wire.EXITS, payload).get("processes")
    if not isinstance(processes, list):
        raise wire.WireError("EXITS frame has no list of processes")
    if len(processes) > 2 * MAX_RANKS_PER_NODE:  # (a launcher's own processes besides)
        raise wire.WireError(f"EXITS frame of {len(processes):,} processes (a node has at "
                             f"most {MAX_RANKS_PER_NODE:,} ranks)")
    out = []
    for p in processes:
        entry = exit_entry(p)
        if entry is None:
            raise wire.WireError(f"EXITS frame has a malformed entry ({_excerpt(p)})")
        if entry["rank"] is not None:  # (a wrapped launcher's own process names none)
            out.append(entry)
    return out


def _json_size(value) -> int:
    try:
        return len(json.dumps(value, separators=(",", ":"), default=str))
    except (TypeError, ValueError, RecursionError):
        return MAX_DETAILS_BYTES + 1


def _excerpt(value) -> str:
    try:
        text = json.dumps(value, default=str)
    except (TypeError, ValueError, RecursionError):
        text = type(value).__name__
    return printable(text, 80)
