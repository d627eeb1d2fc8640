"""The finding: what every detector produces and every front end shows.

The JSON shape is a contract (DESIGN.md, "Findings"): `Finding.to_json()` is exactly one
element of `findings.json`'s "findings" list. `ranks` names the culprits only (the odd ones
out, the ranks that never joined, the rank that died, the late rank), never everyone.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

# `internal`: distdoctor's own failure (a detector that raised, diagnosis/engine/boundary.py), a warning
# that names no rank: never a job's fault, never a culprit
KINDS = ("mismatch", "hang", "deadlock", "long_wait", "straggler", "host", "crash",
         "throttle", "comm_error", "internal")
SEVERITIES = ("error", "warning", "info")
FINDINGS_FILE = "findings.json"


@dataclass
class Finding:
    kind: str
    severity: str
    summary: str
    ranks: list[int] = field(default_factory=list)
    group: str | None = None
    seq: int | None = None
    callsites: list[dict] = field(default_factory=list)  # {"rank", "file", "line", "function"}
    stacks: dict[str, str] = field(default_factory=dict)  # str(rank) -> stack text
    details: dict = field(default_factory=dict)
    remedy: str | None = None

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"unknown finding kind {self.kind!r}")
        if self.severity not in SEVERITIES:
            raise ValueError(f"unknown severity {self.severity!r}")

    @property
    def label(self) -> str:
        """The word a person is shown for its kind: an exception its rank lived past is
        no crash, whatever JSON's kind says ("crash", details.went_on)."""
        return "EXCEPTION" if self.kind == "crash" and self.details.get("went_on") \
            else self.kind.upper()

    @property
    def key(self) -> tuple:
        """Identity for de-duplication: a live engine reports each problem once."""
        return (self.kind, self.group, self.seq, tuple(sorted(self.ranks)))

    def to_json(self) -> dict:
        return {"kind": self.kind, "severity": self.severity, "summary": self.summary,
                "ranks": sorted(self.ranks), "group": self.group, "seq": self.seq,
                "callsites": self.callsites, "stacks": self.stacks, "details": self.details,
                "remedy": self.remedy}

    @classmethod
    def from_json(cls, d: dict) -> Finding:
        """A finding as to_json wrote it. Read from a file (findings.json) or a peer, so
        every field is checked: ValueError, in one line, for one of another type."""
        if not isinstance(d, dict):
            raise ValueError(f"a finding is a JSON object, not {type(d).__name__}")
        for key, types in _FIELD_TYPES.items():
            if key in d and d[key] is not None and not isinstance(d[key], types):
                raise ValueError(f"a finding's {key} is of type {type(d[key]).__name__}")
        for key in ("kind", "severity", "summary"):
            if not isinstance(d.get(key), str):
                raise ValueError(f"a finding has no {key}")
        ranks = list(d.get("ranks") or [])
        if not all(type(r) is int for r in ranks):
            raise ValueError("a finding's ranks are not all integers")
        callsites = list(d.get("callsites") or [])
        if not all(isinstance(c, dict) for c in callsites):
            raise ValueError("a finding's call sites are not all objects")
        stacks = dict(d.get("stacks") or {})
        if not all(isinstance(v, str) for v in stacks.values()):
            raise ValueError("a finding's stacks are not all text")
        seq = d.get("seq")
        if isinstance(seq, bool):
            raise ValueError("a finding's seq is a bool")
        return cls(kind=d["kind"], severity=d["severity"], summary=d["summary"],
                   ranks=ranks, group=d.get("group"), seq=seq, callsites=callsites,
                   stacks=stacks, details=dict(d.get("details") or {}),
                   remedy=d.get("remedy"))


# what from_json accepts for each field (None too, where the field is optional)
_FIELD_TYPES = {"kind": str, "severity": str, "summary": str, "ranks": list,
                "group": (str, int), "seq": int, "callsites": list, "stacks": dict,
                "details": dict, "remedy": str}


def callsite_of(rank: int, callsite: dict | None) -> dict:
    """A finding's call-site entry for one rank (file/line/function may be unknown), with
    the framework frame that issued the op for that line, where one did."""
    cs = callsite or {}
    entry = {"rank": rank, "file": cs.get("file"), "line": cs.get("line"),
             "function": cs.get("function")}
    for key in ("framework", "call"):
        if cs.get(key):
            entry[key] = cs[key]
    return entry


def who(ranks) -> str:
    """Ranks in a summary: 'rank 3', 'ranks 1, 2'."""
    ranks = sorted(ranks)
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"


def site_text(callsite: dict | None) -> str | None:
    """A call site as "file.py:line" (None where it names no file)."""
    if not callsite or not callsite.get("file"):
        return None
    return f"{os.path.basename(callsite['file'])}:{callsite.get('line')}"


def framework_text(callsite: dict | None) -> str | None:
    """The framework frame that issued an op for the user's line, as "Lightning's
    DDPStrategy.barrier" (None where the user's line issued it itself)."""
    fw = (callsite or {}).get("framework")
    if not fw or not fw.get("function"):
        return None
    name = fw.get("name") or "?"
    return f"{name}{chr(39) if name.endswith('s') else chr(39) + 's'} {fw['function']}"


def site_phrase(callsite: dict | None, function: bool = False, full: bool = False) -> str:
    """Where an op was issued, to follow its name in a summary: " at train.py:82" (the
    whole path when `full`; with " in main" when `function`), or, where a framework
    issued it for the user's line, " in Lightning's DDPStrategy.barrier, from
    trainer.fit at train.py:82". "" where the site names no file."""
    cs = callsite or {}
    text = f"{cs.get('file')}:{cs.get('line')}" if full and cs.get("file") else (
        site_text(cs))
    if text is None:
        return ""
    fw = framework_text(cs)
    if fw is not None:  # "from trainer.fit at train.py:82", or "called at ..." unnamed
        return (f" in {fw}, from {cs['call']} at {text}" if cs.get("call")
                else f" in {fw}, called at {text}")
    return f" at {text}" + (f" in {cs['function']}" if function and cs.get("function") else "")


def error_text(error: str | None, limit: int = 120) -> str:
    """An op's error message for a summary: without the "[/build/path/pair.cc:537] " that
    Gloo and c10d put first (it names their source, not the user's), cut to `limit`."""
    text = re.sub(r"^\s*\[[^\]\s]+:\d+\]\s*", "", error or "error").strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"


def write_findings(run_dir: str | os.PathLike, findings: list[Finding], **extra) -> Path:
    """Replace RUN_DIR/findings.json atomically (a live reader never sees half a file)."""
    from distdoctor.runlog.rundir import write_json_atomic

    path = Path(run_dir) / FINDINGS_FILE
    write_json_atomic(path, {"findings": [f.to_json() for f in findings], **extra})
    return path


MAX_FINDINGS_BYTES = 64 << 20  # findings.json (the stacks of thousands of ranks)


def read_findings(run_dir: str | os.PathLike) -> list[Finding]:
    """RUN_DIR/findings.json as written by the live engine; [] when there is none yet.
    Raises ValueError (or OSError) when it is unreadable: not a regular file within
    MAX_FINDINGS_BYTES (privatefiles.read_json), or not a findings file."""
    from distdoctor.privatefiles import read_json

    path = Path(run_dir) / FINDINGS_FILE
    if not path.exists():
        return []
    data = read_json(path, MAX_FINDINGS_BYTES)
    found = data.get("findings") if isinstance(data, dict) else None
    if not isinstance(found, list):
        raise ValueError(f"{path} is not a findings file (no list of findings)")
    return [Finding.from_json(d) for d in found]


# the order findings are listed in: the most severe first, then the kinds that usually
# explain the others (a mismatch explains a hang, a hang a crash of the waiters)
SEVERITY_ORDER = {"error": 0, "warning": 1, "info": 2}
KIND_ORDER = {"mismatch": 0, "deadlock": 1, "hang": 2, "crash": 3, "comm_error": 4,
              "long_wait": 5, "throttle": 6, "straggler": 7, "internal": 8}


def most_severe_first(found: list[Finding]) -> list[Finding]:
    """`found` in the order a report lists them (stable: ties keep their order)."""
    return sorted(found, key=lambda f: (SEVERITY_ORDER.get(f.severity, 3),
                                        KIND_ORDER.get(f.kind, 9)))


def merge_findings(found: list[Finding], written: list[Finding]) -> list[Finding]:
    """Recomputed findings, with the stacks of their written twins and the call sites read
    from those stacks (only the live engine, beside the running ranks, could take stacks),
    plus written ones not recomputed (e.g. comm errors from the job's output, which only
    the launcher saw)."""
    def key(f: Finding) -> tuple:
        return f.kind, tuple(f.ranks), f.group, f.details.get("incarnation")

    by_key = {key(f): f for f in found}
    out = list(found)
    for f in written:
        twin = by_key.get(key(f))
        if twin is None:
            out.append(f)
        elif f.stacks and not twin.stacks:
            twin.stacks = f.stacks
            from_stacks = [c for c in f.callsites if c.get("source") == "stack"]
            twin.callsites = from_stacks + [c for c in twin.callsites if c not in from_stacks]
    return out
