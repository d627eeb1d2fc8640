"""Call sites, interned: the user's line that issued an op (or opened a span, or was
sampled) is written to the event log once, as a string, and found again by its key.

The key, `site_key`, is the frame's code and instruction offset, whether the op is the
main thread's taken for another thread, the issuing thread, then the code and offset of
each user frame that called it (`callsite.callers`). The C path (runlog/_fast.c: its
`site_key` and `callsite_id`) builds the same key in its own table and hands a site it
has not seen to `CallSites.at`: a change to the key is made in both places.
"""

from __future__ import annotations

from distdoctor.tracer import callsite, compiled


def site_key(frame, from_main: bool, thread: int) -> tuple:
    """A call site's key: (id(code), instruction offset, from_main, thread, then id(code)
    and offset of each user frame that called it). Offsets, not line numbers: f_lineno
    scans the line table on every access. Ids, not code objects: hashing a code object
    hashes its whole bytecode."""
    key = [id(frame.f_code), frame.f_lasti, from_main, thread]
    for f in callsite.callers(frame):
        key += (id(f.f_code), f.f_lasti)
    return tuple(key)


class CallSites:
    """A rank's call sites, each written to `ring` (the event log) as a string once."""

    def __init__(self, ring):
        self.ring = ring
        self._table: dict = {}  # site_key() -> (string id, code, the callers' codes)

    def current(self) -> tuple[int, bool]:
        """(the string id of the user's line issuing the op now, or 0; whether it is the
        main thread's line, taken for a thread with no user frame of its own)."""
        frame, from_main = callsite.find_user_frame()
        if frame is None:
            return 0, False
        return self.of(frame, from_main, 0 if from_main else None), from_main

    def of(self, frame, from_main: bool, thread: int | None = None) -> int:
        """The string id of the call site at user frame `frame`, interned on first sight.
        `thread`: whose op it is (callsite.thread_key(); default: the calling thread)."""
        key = site_key(frame, from_main, callsite.thread_key() if thread is None else thread)
        hit = self._table.get(key)
        return hit[0] if hit is not None else self.at(frame, key, self._table)

    def at(self, frame, key, table: dict) -> int:
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
        if up:
            site["callers"] = [{"file": f.f_code.co_filename, "line": f.f_lineno,
                                "function": getattr(f.f_code, "co_qualname", f.f_code.co_name)}
                               for f in up]
        sid = self.ring.add_string(site)
        # keeps the codes (and so their ids in the key) alive
        table[key] = (sid, code, *(f.f_code for f in walked))
        return sid

    def off_main(self) -> tuple[int, bool]:
        """For the C path: an op on a thread with no user frame takes the main thread's."""
        frame = callsite.main_thread_user_frame()
        return (0, False) if frame is None else (self.of(frame, True, 0), True)
