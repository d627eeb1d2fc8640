"""Python exceptions on a rank: follows each process's traceback to its last line, and
names the exception with the user's frame it was raised from.

An exception whose message another family already reads (a NCCL error, a gloo timeout, a
CUDA OOM) is that family's signal: the traceback only adds where it was raised.
"""

from __future__ import annotations

import re

from distdoctor.findings import Finding
from distdoctor.logs import remedies as R
from distdoctor.logs.bounds import small_int
from distdoctor.logs.families.launcher import how_it_ended
from distdoctor.logs.families.progress import trained_before
from distdoctor.logs.lines import LogLine
from distdoctor.logs.problems import Problem, clip, plural, ranks_text, short_path
from distdoctor.logs.signals import (
    BENIGN,
    CAUSE,
    TEARDOWN,
    TIMEOUT,
    UNKNOWN,
    VICTIM,
    Family,
    Signal,
    rule,
)

NAME = "exception"

_START = "Traceback (most recent call last):"
_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<function>.+)$')
# (the bare `Exception` too: `raise Exception("...")` is common in user and framework code)
_EXC = re.compile(r"^(?P<type>(?:[A-Za-z_]\w*\.)*(?:[A-Z]\w*(?:Error|Exception|Interrupt|Exit|"
                  r"Iteration|Failure|Timeout|Warning|Fault)|Exception))(?::\s?(?P<message>.*))?$")
_OTHER_EXC = re.compile(r"^(?P<type>(?:[A-Za-z_]\w*\.)+[A-Z]\w*|[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)+)"
                        r"(?::\s?(?P<message>.*))?$")
_CHAINED = ("During handling of the above exception", "The above exception was the direct")
# frames that are never the user's line
_LIBRARY = re.compile(r"/(?:site|dist)-packages/|/lib/python3\.\d+/|^<frozen |/torch/"
                      r"(?!testing/)")
_TEARDOWN = re.compile(r"SignalException|KeyboardInterrupt|SystemExit|ChildFailedError|"
                       r"ProcessRaisedException|"
                       r"BrokenPipeError: \[Errno 32\]")
# threading.excepthook's head: "Exception in thread Thread-1 (worker):"
_THREAD_HEAD = re.compile(r"^Exception in thread (?P<name>.+):\s*$")
_LAUNCHER = re.compile(r"torch/distributed/(?:run\.py|elastic/|launcher/)|/torchrun$|"
                       r"torch/multiprocessing/spawn\.py")
MAX_OPEN = 10_000  # processes followed at once


class Tracebacks:
    """Not a `Family`: it sees every line its anchors let through and may annotate the
    signals another family made of the same line instead of adding its own."""

    name = NAME
    anchors = (b"Traceback", b'File "', b"Error", b"Exception", b"Interrupt", b"Exit",
               b"rror:", b"above exception")

    def __init__(self):
        self._open: dict[object, dict] = {}
        self._ignored: set = set()  # processes whose next traceback Python says it ignored
        self._threads: dict[object, str] = {}  # process -> the thread its next traceback ended

    def holds(self, who) -> bool:
        """Whether a traceback of this process is open (its next lines are its)."""
        return who in self._open

    def feed(self, line: LogLine, claimed: list[Signal]) -> list[Signal]:
        text = line.text
        who = line.who
        if text.lstrip().startswith("Exception ignored in"):
            # Python printing an exception it ignored (a __del__ or an atexit hook at
            # shutdown): its traceback follows, and it stopped nothing
            if len(self._ignored) < MAX_OPEN:
                self._ignored.add(who)
            return []
        if (m := _THREAD_HEAD.match(text.lstrip())) is not None:
            # threading's report of a thread's uncaught exception: its traceback follows,
            # and it ended that thread, not the process
            if len(self._threads) < MAX_OPEN:
                self._threads[who] = m["name"][:120]
            return []
        if _START in text:
            if len(self._open) >= MAX_OPEN:
                self._open.pop(next(iter(self._open)))
            # a prefix may leave its own indent: the traceback's lines are read relative to it
            indent = len(text) - len(text.lstrip())
            self._open[who] = {"frames": [], "sources": {}, "line": line, "indent": indent,
                               "ignored": who in self._ignored,
                               "thread": self._threads.pop(who, None)}
            self._ignored.discard(who)
            return []
        tb = self._open.get(who)
        if tb is None:
            if 'File "' not in text or not _FRAME.match(text.lstrip()):
                return []
            # a frame with no "Traceback" head before it: a paste that starts inside one
            if len(self._open) >= MAX_OPEN:
                self._open.pop(next(iter(self._open)))
            tb = self._open[who] = {"frames": [], "sources": {}, "line": line,
                                    "indent": max(0, len(text) - len(text.lstrip()) - 2),
                                    "ignored": False}
        text = text[min(tb["indent"], len(text) - len(text.lstrip())):]
        if (m := _FRAME.match(text)) and (lineno := small_int(m["line"])) is not None:
            tb["frames"].append((m["file"], lineno, m["function"].strip()[:200]))
            del tb["frames"][:-40]
            tb["sources"][len(tb["frames"]) - 1] = None
            return []
        if text.startswith((" ", "\t")) or not text.strip() or set(text.strip()) <= {"^", "~"}:
            # the source line under a frame (kept: it may name a peer), or its carets
            if tb["frames"] and text.strip() and not set(text.strip()) <= {"^", "~"}:
                tb["sources"].setdefault(len(tb["frames"]) - 1, text.strip()[:200])
                if tb["sources"][len(tb["frames"]) - 1] is None:
                    tb["sources"][len(tb["frames"]) - 1] = text.strip()[:200]
            return []
        if any(c in text for c in _CHAINED):
            return []
        if "head" in tb:  # the message goes on from "... raised:" on this line
            kind, msg = tb.pop("head")
            joined = f"{kind}: {msg} {text.strip()}"
            m = _EXC.match(joined) or _OTHER_EXC.match(joined)
        else:
            m = _EXC.match(text.strip())
        if not m and tb["frames"]:
            # a last line with a name of another shape ("torch._dynamo.exc.Unsupported: ...",
            # "BackendCompilerFailed: ..."): qualified, or a class name of two words or more
            m = _OTHER_EXC.match(text.strip())
        if not m:
            return []  # another line of this process (a progress bar) inside its traceback
        if (m["message"] or "").rstrip().endswith(":") and tb["frames"] and "head" not in tb:
            tb["head"] = (m["type"], m["message"].strip())  # dynamo's "backend=... raised:"
            return []
        del self._open[who]
        if not tb["frames"]:
            return []
        where = _where(tb["frames"], tb["sources"])
        # raised in the launcher's own process (torchrun's agent), not in a rank
        launcher = any(_LAUNCHER.search(f[0]) for f in tb["frames"])
        for s in claimed:  # another family read the message: add where it was raised
            s.fields.setdefault("where", where)
            s.fields.setdefault("exception", m["type"])
            s.fields.setdefault("in_launcher", launcher)
        if claimed:
            return []
        f = {"exception": m["type"], "message": (m["message"] or "").strip()[:300],
             "where": where, "in_launcher": launcher}
        if tb.get("thread"):
            f["thread"] = tb["thread"]
        role = TEARDOWN if _TEARDOWN.search(text) else BENIGN if tb["ignored"] else CAUSE
        return [Signal("exception", NAME, role, line, f)]


    def pending(self) -> list[Signal]:
        """Tracebacks the log ends inside (cut before their exception line): an error no
        family knows, where the user's innermost frame is the one clue (fallback.py)."""
        out = []
        for tb in list(self._open.values())[:100]:
            if tb["frames"] and not tb["ignored"]:
                out.append(Signal("error_line", "unknown", UNKNOWN, tb["line"], {
                    "error": "cut", "exception": "Traceback", "message": "",
                    "where": _where(tb["frames"], tb["sources"]),
                    "in_launcher": any(_LAUNCHER.search(f[0]) for f in tb["frames"])}))
        return out


def _where(frames: list[tuple[str, int, str]], sources: dict | None = None) -> dict:
    """The innermost frame of the user's code (else the innermost frame), with its source
    line when the traceback shows it."""
    user = [i for i, f in enumerate(frames) if not _LIBRARY.search(f[0])]
    i = user[-1] if user else len(frames) - 1
    file, lineno, function = frames[i]
    out = {"file": file, "line": lineno, "function": function}
    if sources and sources.get(i):
        out["source"] = sources[i]
    return out


class UsageErrors(Family):
    """A script that refused its command line (argparse): exits 2 with no traceback."""

    name = "startup"
    anchors = (b": error: ",)
    rules = (rule("usage_error", "startup", CAUSE,
                  r"^(?!srun|slurmstepd|mpirun|bash|sh:)(?P<prog>[\w./-]+): error: "
                  r"(?P<message>.+)$"),)


# --- what its problems mean ---------------------------------------------------------------
def describe(p: Problem, ctx) -> Finding:
    """An exception on some ranks; every rank failing the same way (before any collective: a
    start-up failure) is one finding."""
    if p.rule in ("cuda_error", "c_assert"):
        from distdoctor.logs.families import cuda

        return cuda.describe(p, ctx)
    f = dict(p.first.fields)
    if p.rule == "usage_error":
        f["exception"] = f"{f.get('prog', 'the script')}: error"
    ranks = sorted(p.ranks)
    where = f.get("where") or {}
    at = (f" at {short_path(where['file'])}:{where['line']} in {where['function']}"
          if where.get("file") else "")
    msg = f": {clip(f['message'], 160)}" if f.get("message") else ""
    if f.get("thread"):
        return _thread_died(p, ctx, f, f"{f['exception']}{msg}{at}", where)
    every = len(ranks) >= 2 and ctx.ev.ranks and set(ranks) >= ctx.ev.ranks
    named = sorted(r for r in ctx.exits if r >= 0)  # (not a rank the launcher left unnamed)
    if not ranks and p.count >= 2 and len(named) == p.count:
        # the same traceback once per process, unlabelled: one per rank the launcher had
        ranks, every = named, True
    if p.rule == "usage_error" and not every:  # the launcher's exits say who else failed
        failed = {e["rank"] for e in ctx.exits.values()
                  if e.get("exit_code") == 2 and not e.get("torn_down")}
        every = len(failed) >= 2 and failed >= set(ranks)
        ranks = sorted(failed | set(ranks)) if every else ranks
    if every:
        early = not any(q.role == TIMEOUT or q.family in ("nccl", "gloo")
                        for q in ctx.problems.values()
                        if q.first.order < p.first.order and q.role != BENIGN)
        # a failure after the job reported training steps came mid-run
        early = early and not trained_before(p.first.line)
        lead = (f"every rank ({ranks_text(ranks)}) failed at start-up with " if early
                else f"every rank ({ranks_text(ranks)}) raised ")
        fnd = ctx.finding(p, "crash", "error", f"{lead}{f['exception']}{msg}{at}", ranks,
                          R.STARTUP if early else R.EXCEPTION)
        fnd.details["family"] = "startup" if early else NAME
        return fnd
    how = ""
    ended = [ctx.exits[r] for r in ranks if r in ctx.exits]
    if ended:
        how = f" and {how_it_ended(ended[0])}"
    elif ranks and ctx.alive_after(ranks[0], p.first):
        how = " (it had not exited when the log ends: the others wait for it)"
    summary = (f"rank{plural(ranks)} {ranks_text(ranks)} raised {f['exception']}{msg}{at}{how}"
               if ranks else f"{f['exception']}{msg}{at}")
    if p.rule == "exception":  # the program's own error: said as such, not guessed at
        summary += " (an error in the program, not a known distributed-training failure)"
    fnd = ctx.finding(p, "crash", "error", summary, ranks, R.EXCEPTION)
    if where.get("file"):
        fnd.callsites = [{"rank": r, **where} for r in ranks[:8]]
    return fnd


def _thread_died(p: Problem, ctx, f: dict, what: str, where: dict) -> Finding:
    """A thread's uncaught exception: that thread ended, its process did not (went_on
    says whether the job's failure may come of it)."""
    ranks = sorted(p.ranks)
    of = f" of rank{plural(ranks)} {ranks_text(ranks)}" if ranks else ""
    fnd = ctx.finding(p, "crash", "error", f"a thread ({clip(f['thread'], 60)!r}){of} died "
                      f"of {what}", ranks, R.THREAD)
    fnd.details["thread"] = f["thread"]
    if where.get("file"):
        fnd.callsites = [{"rank": r, **where} for r in ranks[:8]]
    return fnd


def went_on(p: Problem, ctx) -> str | None:
    """An exception its rank lived well past (a framework caught and logged it), in a log
    with no other failure: a warning. A thread's, in a log with no failure it may explain
    (an exit that failed, a timeout, a rank waited for): a warning whatever followed it."""
    if p.rule == "exception" and p.first.fields.get("thread"):
        failed = any(e.get("exit_code") not in (0, None) or e.get("signum")
                     for e in ctx.exits.values())
        if failed or any(q.role in (TIMEOUT, VICTIM) for q in ctx.problems.values()):
            return None
        return "warning"
    if p.rule not in ("exception", "cuda_error") or not p.ranks:
        return None
    for r in p.ranks:
        a = ctx.ev.of_rank(r)
        if a is None or a.file != p.first.line.file or a.last_lineno <= p.first.line.lineno + 20:
            return None
    if ctx.exits or any(q.role in (TIMEOUT, VICTIM) for q in ctx.problems.values()):
        return None
    return "warning"
