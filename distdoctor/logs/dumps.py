"""Stack dumps in a log: where a process that printed no error stood when it was dumped.

Two writers: CPython's faulthandler ("Thread 0x... (most recent call first):", then
`  File "f.py", line 12 in fn` per frame, innermost first; a `Timeout (0:00:05)!` or
`Fatal Python error: Aborted` line before it) and py-spy (`Thread 123 (idle): "MainThread"`,
then `fn (f.py:12)`).

Several processes dumping at once (a signal sent to every rank, every rank's watchdog
expiring together) write into the same combined log. faulthandler writes each piece of
a frame (`  File `, the quote, the file, `, line `, the number, ` in `, the name, the
newline) with a write() of its own (Python/traceback.c, dump_frame; an ASCII string whole
since bpo-45831, CPython 3.10.1, a character at a time before), so dumps written at once tear
each other's lines: `  File   File ""/a.py/b.py", line ...`. A torn line belongs to no one
process, and the frames after it cannot be told apart: a stack is read up to its first
torn line (the whole frames before it, its innermost, were written by its process alone;
another's dump begins with a line of its own, a fatal error's or a thread's head), and a
stack torn from its first frame is not read at all, rather than name a frame the process
was never in.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from distdoctor.logs.bounds import small_int
from distdoctor.logs.lines import LogLine

# a whole head line (what one writer writes alone)
_WHOLE_HEAD = re.compile(r"^(?:Thread 0x[0-9a-f]+ \(most recent call first\):|Current thread "
                         r"0x[0-9a-f]+ \(most recent call first\):|Thread \d+ \((?:idle|active)"
                         r"[^)]*\): \")")
# a thread's head, anywhere in a line: where a torn line holds one, a stack begins there
_HEAD_PIECE = re.compile(r"(?:Current thread|Thread) 0x|^Thread \d+ \((?:idle|active)")
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>[^\s"]+)\s*$|'
                    r"^\s*(?P<func2>[\w.<>]+) \((?P<file2>[^:()]+):(?P<line2>\d+)\)\s*$")
# faulthandler's own words: a line holding them that is neither a whole frame nor a whole
# line of a Python traceback (`File "f.py", line 12, in fn`) is torn
_PIECES = re.compile(r'File "|  File |", line |, line \d')
_TRACEBACK_FRAME = re.compile(r'^\s*File "[^"]+", line \d+, in \S+\s*$')
# faulthandler's lines around the stacks (a timeout's, a fatal error's): part of the dump
_AROUND = re.compile(r"^(?:Timeout \(\d|Fatal Python error|Python runtime state|Extension modules)")
# a main thread's outermost frame (a script's, or runpy's under `python -m`)
_MAIN = ("<module>", "_run_module_as_main")
_THREAD = ("_bootstrap", "_bootstrap_inner")  # a thread's (threading.py)
_LAST = ("_run_module_as_main", "_bootstrap")  # frames no frame of the same stack follows
MAX_FRAMES = 200  # read of one stack (faulthandler writes at most 100)


def torn_words(heads: int) -> str:
    """What a finding says of a burst of dumps none of which could be read."""
    if heads > 1:
        return (f"{heads} stack dumps were printed at the same moment and tore each other's "
                f"lines, so where the job stood is not read from them")
    return ("a stack dump was printed, but other output tore its lines, so where the job "
            "stood is not read from it")


def torn_piece(text: str) -> bool:
    """Whether a line holds pieces of faulthandler's frames without being one whole frame
    (nor a whole line of a Python traceback): dumps written at once tore it."""
    return (_PIECES.search(text) is not None and _FRAME.match(text) is None
            and _TRACEBACK_FRAME.match(text) is None)


@dataclass
class Dump:
    frames: list[dict] = field(default_factory=list)  # innermost first; [] if none read
    torn: bool = False  # dumps written at once tore each other's lines (see the docstring)
    heads: int = 0  # thread stacks begun in the last dump (or burst of dumps written at once)


@dataclass
class _Stack:
    head: int  # index of its head line in the lines read
    frames: list[dict] = field(default_factory=list)
    torn: bool = False
    after: bool = False  # a line of the job's own follows it before the next head
    cut: bool = False  # torn after its first whole frames, which are kept (_read_stack)
    pieces: int = 0  # lines of frames in it, whole or torn (a head alone is no dump)


def read_last_dump(tail: list[LogLine]) -> Dump:
    """The last stack dump in `tail`: the frames of its last whole thread stack (a main
    thread's before any other) within the last burst of dumps; none if that burst's
    stacks are all torn."""
    heads = [i for i, ll in enumerate(tail)
             if _heads_in(ll.text) and not _AROUND.match(ll.text.lstrip())]
    burst: list[_Stack] = []
    for n in range(len(heads) - 1, -1, -1):
        end = heads[n + 1] if n + 1 < len(heads) else len(tail)
        stack = _read_stack(tail, heads[n], end)
        if stack.after and burst:
            break  # an older dump: the job printed on after it
        burst.append(stack)
    whole = [s for s in burst if s.frames and not s.torn]
    # torn: a stack that had frames' words (a line that merely says "Thread 0x" is none)
    torn = any((s.torn or s.cut) and s.pieces for s in burst)
    count = sum(_heads_in(tail[s.head].text) for s in burst)
    # a main thread's stack first; in a torn burst, a whole stack of a thread beside it
    # says nothing of where the job stood
    main = next((s for s in whole if _outermost(s) in _MAIN), None)
    if main is None:
        main = next((s for s in whole if not torn or _outermost(s) not in _THREAD), None)
    if main is None:
        return Dump(torn=torn, heads=count)
    return Dump(main.frames, torn, count)


def _heads_in(text: str) -> int:
    """How many thread stacks begin in a line (two or more: dumps written at once)."""
    return len(_HEAD_PIECE.findall(text.strip()))


def _outermost(stack: _Stack) -> str:
    return stack.frames[-1]["function"].rsplit(".", 1)[-1]  # py-spy: Thread._bootstrap


def _read_stack(tail: list[LogLine], head: int, end: int) -> _Stack:
    """The stack whose head is `tail[head]`, read up to the next head (`end`): its frame
    lines, the job's other lines skipped (another process' output between two frames).
    A head line that is not whole, a torn line among its frames, or a frame after one
    that nothing calls (whole lines of two stacks, interleaved) makes it torn."""
    first = tail[head]
    st = _Stack(head, torn=not (_WHOLE_HEAD.match(first.text.strip())
                                and _heads_in(first.text) == 1),
                pieces=int(bool(_PIECES.search(first.text))))
    who = first.who
    for ll in tail[head + 1:min(end, head + 1 + MAX_FRAMES)]:
        if who is not None and ll.who is not None and ll.who != who:
            continue  # another rank's line, its prefix says so: not of this stack
        m = _FRAME.match(ll.text)
        if m is not None and (lineno := small_int(m["line"] or m["line2"])) is not None:
            st.pieces += 1
            if st.frames and _outermost(st) in _LAST:
                st.torn = True  # nothing calls these: another stack's lines, interleaved
            st.frames.append({"file": m["file"] or m["file2"],
                              "line": lineno,
                              "function": m["func"] or m["func2"]})
        elif _PIECES.search(ll.text) and not _TRACEBACK_FRAME.match(ll.text):
            st.pieces += 1
            if st.frames and not st.torn:
                # the tearing began here: the frames before it are this process' alone,
                # its innermost ones (another's dump tears in after its own first line,
                # "Fatal Python error: ..." or its head); the rest of it cannot be read
                st.cut = True
                break
            st.torn = True
        elif st.frames and not _AROUND.match(ll.text.lstrip()):
            st.after = True
    return st
