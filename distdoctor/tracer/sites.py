"""Call sites, interned: the user's line that issued an op (or opened a span, or was
sampled) is written to the event log once, as a string, and found again by its key.

The key, `site_key`, is the frame's code and instruction offset, whether the op is the
main thread's taken for another thread, the issuing thread, the code and offset of the
innermost framework frame below the user's line (0, 0 where none: one `trainer.fit(...)`
line issues Lightning's barrier and its gather, two sites), then the code and offset of
each user frame that called it (`callsite.callers`). The C path (runlog/_fast.c: its
`site_key` and `callsite_id`) builds the same key in its own table and hands a site it
has not seen to `CallSites.at`: a change to the key is made in both places. A site is
written once whatever its key: two keys of one line (its code compiled twice) share it.
"""

from __future__ import annotations

import json
import linecache
import re

from distdoctor.runlog.sources import note as keep_source
from distdoctor.tracer import callsite, compiled

# A key names its code objects by id, so a table entry keeps them alive. A program that
# compiles its code anew for each op (exec of a real file's text, a template per step)
# made a new key, a new kept code and a new string per op (13 MB a rank over 10,000 ops).
# Keys are kept for at most MAX_KEYS_PER_SITE of one site (many keys of one line are
# common: a loop torch.compile unrolled, one generated offset a turn) and MAX_SITES in
# all; a site's further keys find its string by what it says, each time, keeping nothing.
MAX_KEYS_PER_SITE = 256
MAX_SITES = 1 << 16


def site_key(frame, from_main: bool, thread: int, fw=None) -> tuple:
    """A call site's key: (id(code), instruction offset, from_main, thread, id(code) and
    offset of the framework frame `fw` or 0, 0, then id(code) and offset of each user
    frame that called it). Offsets, not line numbers: f_lineno scans the line table on
    every access. Ids, not code objects: hashing a code object hashes its whole bytecode."""
    key = [id(frame.f_code), frame.f_lasti, from_main, thread,
           id(fw.f_code) if fw is not None else 0, fw.f_lasti if fw is not None else 0]
    for f in callsite.callers(frame):
        key += (id(f.f_code), f.f_lasti)
    return tuple(key)


class CallSites:
    """A rank's call sites, each written to `ring` (the event log) as a string once."""

    def __init__(self, ring):
        self.ring = ring
        self._table: dict = {}  # site_key() -> (string id, code, the callers' codes)
        # what a site says (JSON) -> (its string id, keys kept for it in the tables)
        self._said: dict[str, tuple[int, int]] = {}

    def current(self) -> tuple[int, bool]:
        """(the string id of the user's line issuing the op now, or 0; whether it is the
        main thread's line, taken for a thread with no user frame of its own)."""
        frame, from_main, fw = callsite.find_user_frame()
        if frame is None:
            return 0, False
        return self.of(frame, from_main, 0 if from_main else None, fw), from_main

    def of(self, frame, from_main: bool, thread: int | None = None, fw=None) -> int:
        """The string id of the call site at user frame `frame`, interned on first sight.
        `thread`: whose op it is (callsite.thread_key(); default: the calling thread);
        `fw`: the framework's frame that issued it for the user's line, if any."""
        key = site_key(frame, from_main,
                       callsite.thread_key() if thread is None else thread, fw)
        hit = self._table.get(key)
        return hit[0] if hit is not None else self.at(frame, key, self._table, fw)

    def at(self, frame, key, table: dict, fw=None) -> int:
        """Intern a call site seen for the first time; `table[key]` remembers it (the C
        path keys its own table by instruction index, this one by byte offset; both keys
        are site_key()'s shape). The site names the thread that issued the op where that
        is not the main thread, and the user's frames that called it."""
        code = frame.f_code
        walked = callsite.callers(frame)
        # (not dynamo's frame of a compiled function, which stands at its first line)
        up = [f for f in walked if not compiled.runs_a_graph(f)]
        site = compiled.site_of(frame)  # for code torch generated, the user's line
        if key[2]:
            site["thread"] = "main (op issued from another thread)"
        elif key[3]:
            site["thread"] = callsite.thread_name(key[3])
            site["thread_id"] = key[3]
        if fw is not None:
            site.update(framework_site(fw, frame))
        if up:
            site["callers"] = [compiled.frame_site(f) for f in up]
        said = json.dumps(site, sort_keys=True, default=str)
        sid, kept = self._said.get(said, (0, 0))
        if not sid:
            sid = self.ring.add_string(site)
            keep_source(self.ring, site)  # queued for the run's copy of its files (no I/O)
        if kept < MAX_KEYS_PER_SITE and len(table) < MAX_SITES:
            # keeps the codes (and so their ids in the key) alive
            table[key] = (sid, code, *(f.f_code for f in walked), fw and fw.f_code)
            kept += 1
        if sid and (said in self._said or len(self._said) < MAX_SITES):
            self._said[said] = (sid, kept)
        return sid

    def off_main(self, fw=None) -> tuple[int, bool]:
        """For the C path: an op on a thread with no user frame takes the main thread's
        line; `fw`, the framework frame on the op's own thread (else the main thread's)."""
        frame, main_fw = callsite.main_thread_frames()
        return (0, False) if frame is None else (self.of(frame, True, 0, fw or main_fw), True)


def framework_site(fw, user) -> dict:
    """What a site says of the framework's frame `fw` that issued the op for the user's
    frame `user`: {"framework": {name, function, file, line}, "call": what the user's
    line called ("trainer.fit"), where it can be told}."""
    code = fw.f_code
    out = {"framework": {"name": callsite.framework_of(code.co_filename) or "?",
                         "function": getattr(code, "co_qualname", code.co_name),
                         "file": code.co_filename, "line": fw.f_lineno}}
    call = called_name(user, fw)
    if call:
        out["call"] = call
    return out


_CALL = re.compile(r"([A-Za-z_][\w.]*)\s*\(")
_NOT_CALLS = frozenset({"if", "elif", "while", "for", "return", "with", "not", "and", "or",
                        "in", "assert", "yield", "await", "lambda"})


def called_name(user, fw) -> str | None:
    """The name the user's line calls into the framework by ("trainer.fit"): on the
    line's text, the call whose last name is the function the user's frame entered (the
    frame under it); else the line's first call. None where the source is not at hand."""
    entered = None
    frame = fw
    while frame is not None and frame.f_back is not None and frame.f_back is not user:
        frame = frame.f_back
    if frame is not None and frame.f_back is user:
        entered = frame.f_code.co_name
    text = linecache.getline(user.f_code.co_filename, user.f_lineno)
    calls = [c for c in _CALL.findall(text) if c.rpartition(".")[2] not in _NOT_CALLS]
    for name in calls:
        if name.rpartition(".")[2] == entered:
            return name
    return calls[0] if calls else None
