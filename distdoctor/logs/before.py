"""Cause before symptom: the error a job died of, read with what the same process printed
just before it. The loudest line is often a consequence: NCCL's "unhandled system error"
after the driver's library failed to load; a Ray worker's death after the worker itself
printed a segfault; a launcher's SIGTERM after a sibling process died; a scheduler's time
limit after the run had said it finished. The remedy follows the cause, not the last line.
"""

from __future__ import annotations

import re

from distdoctor.findings import Finding
from distdoctor.logs.dumps import read_last_dump, torn_words
from distdoctor.logs.lines import LogLine
from distdoctor.logs.problems import clip, short_path
from distdoctor.logs.signals import UNKNOWN, Signal
from distdoctor.logs.story import FINISHED, Story

LOOK_BACK = 60  # lines before an error read for its cause
# the driver's and CUDA's own libraries: when one of them did not load, what fails next is a
# consequence (libibverbs and NCCL's net plugin fail to load on healthy jobs: not these)
_LIBRARY = re.compile(r"\b(lib(?:nvidia-ml|cuda|nccl|cudart|cublas(?:Lt)?|cudnn\w*|nvrtc|"
                      r"nvJitLink|nvidia-ptxjitcompiler)\.so(?:\.\d+)*)")
_LOAD_FAILED = re.compile(r"[Ff]ailed to (?:open|load|find)|cannot open shared object|"
                          r"[Cc]ould not (?:load|open|find)|[Uu]nable to (?:load|open|find)|"
                          r"load library failed|not found")
# another process of the job dying, in its supervisor's words ("Engine core proc EngineCore_0
# died unexpectedly", "worker 3 exited with code -9", "process 812 was killed")
_SIBLING_DIED = re.compile(
    r"\b(?:died|exited|terminated|crashed|was killed|is dead|has died)\b.{0,40}?"
    r"(?:unexpectedly|with (?:exit )?code -?\d+|by signal|signal \d+|SIG[A-Z]+)|"
    r"\bdied unexpectedly\b|\b(?:process|worker|server|engine)\b.{0,40}\bdied\b", re.I)
_ISO = re.compile(r"(\d\d):(\d\d):(\d\d)")

LIBRARY_REMEDY = ("{lib} did not load in the job's environment, and what failed next depends "
                  "on it: the container or node does not expose the driver's libraries (start "
                  "the container with the NVIDIA runtime / `--gpus all`, or add the driver's "
                  "library dir to LD_LIBRARY_PATH); check inside the job with `ldconfig -p | "
                  "grep {stem}` and `nvidia-smi`. The network is not the cause.")
EXIT_REMEDY = ("The run had finished: its processes did not exit, and the scheduler's time "
               "limit ended them. Look at what runs after training: destroy_process_group() "
               "(call it on every rank), a barrier or collective only some ranks reach at "
               "exit, dataloader workers (persistent_workers), a logger's or tracker's "
               "finish() waiting on the network; `py-spy dump` a process at that point. "
               "Raising --time would not help.")
SIBLING_REMEDY = ("The SIGTERM followed another process of the job dying: the supervisor "
                  "(Ray, a process manager, the framework's engine client) stops the group "
                  "when one member dies. Read why that process died (its own log, `dmesg -T` "
                  "for the OOM killer); the SIGTERM is its consequence.")
CRASH_REMEDY = ("The process crashed itself ({what}) before it was reported dead: a native "
                "crash, not a kill from outside. The frames it printed show where; in CUDA "
                "graph replay or a custom kernel, rerun with CUDA graphs off (vLLM: "
                "enforce_eager=True) and CUDA_LAUNCH_BLOCKING=1 to find the kernel.")


def causes_first(found: list[Finding], story: Story, first_lines: dict,
                 signals: list[Signal]) -> None:
    """Rewrites, in place, the findings whose cause the lines before them show."""
    fatal = [s for s in signals if s.role == UNKNOWN
             and s.fields.get("error") in ("signal", "fatal")]
    for f in found:
        if f.severity != "error":
            continue
        line = first_lines.get(id(f))
        if line is None:
            continue
        before = _lines_before(story, line)
        (_time_limit_after_finish(f, story, line) or _library_failed(f, before + [line])
         or _crashed_itself(f, line, fatal) or _sibling_died(f, before)
         or _stuck_when_stopped(f, story, line))


def _lines_before(story: Story, line: LogLine) -> list[LogLine]:
    fs = story.files.get(line.file)
    return fs.lines_before(line.lineno, LOOK_BACK) if fs is not None else []


def _library_failed(f: Finding, before: list[LogLine]) -> bool:
    if f.details.get("family") not in ("nccl", "exception", "cuda", "unknown", "startup"):
        return False
    for ll in reversed(before):
        m = _LIBRARY.search(ll.text)
        if m and _LOAD_FAILED.search(ll.text):
            lib = m.group(1)
            f.summary = f"{lib} could not be loaded, then: {f.summary}"
            f.details["cause_before"] = {"rule": "library_not_loaded", "library": lib,
                                         "line": ll.lineno, "text": ll.text.strip()[:300]}
            f.remedy = LIBRARY_REMEDY.format(lib=lib, stem=lib.split(".so")[0])
            return True
    return False


def _crashed_itself(f: Finding, line: LogLine, fatal: list[Signal]) -> bool:
    """A process reported dead (a Ray worker, a launcher's exit) that printed a fatal
    signal of its own just before."""
    if f.details.get("family") not in ("ray", "launcher"):
        return False
    mine = [s for s in fatal if s.line.lineno < line.lineno and s.line.file == line.file
            and s.line.pid is not None and f"pid {s.line.pid}" in f.summary]
    if not mine:
        return False
    sig = next((s for s in mine if s.fields.get("error") == "fatal"), mine[0])
    what = sig.fields.get("message") or sig.fields.get("exception") or "a fatal signal"
    where = sig.fields.get("where")
    at = (f" at {short_path(where['file'])}:{where['line']} in {where['function']}"
          if where else "")
    names = sorted({s.fields.get("exception") for s in mine if s.fields.get("error") == "signal"})
    sigs = f" ({', '.join(n for n in names if n)})" if any(names) else ""
    f.summary = f"the process crashed with {what}{sigs}{at}, then: {f.summary}"
    f.details["cause_before"] = {"rule": "crashed_itself", "line": sig.line.lineno,
                                 "text": sig.line.text.strip()[:300]}
    if where:
        f.callsites = [{"rank": None, **where}]
    f.remedy = CRASH_REMEDY.format(what=what)
    return True


def _sibling_died(f: Finding, before: list[LogLine]) -> bool:
    if f.details.get("family") != "launcher" or "SIG" not in f.summary:
        return False
    for ll in reversed(before[-30:]):
        if _SIBLING_DIED.search(ll.text):
            f.summary += (f", after another process of the job died: "
                          f"{clip(ll.text.strip(), 140)!r}")
            f.details["cause_before"] = {"rule": "sibling_died", "line": ll.lineno,
                                         "text": ll.text.strip()[:300]}
            f.remedy = SIBLING_REMEDY
            return True
    return False


def _time_limit_after_finish(f: Finding, story: Story, line: LogLine) -> bool:
    if f.details.get("family") != "slurm" or "time limit" not in f.summary:
        return False
    fs = story.files.get(line.file)
    done = [m for m in fs.before(line.lineno) if m.kind == FINISHED] if fs else []
    if not done:
        return False
    end = done[-1]
    idle = _minutes_between(end.line, line)
    sat = f" and sat {idle} min" if idle else ""
    f.summary = (f"training had finished ({clip(end.text, 90)!r}){sat} until Slurm's time "
                 f"limit ended it: the processes did not exit after training; {f.summary}")
    f.details["cause_before"] = {"rule": "finished_then_time_limit", "line": end.line.lineno,
                                 "text": end.text[:300], "idle_minutes": idle}
    f.remedy = EXIT_REMEDY
    return True


def _minutes_between(a: LogLine, b: LogLine) -> int | None:
    ta = _ISO.search(a.when or "") or _ISO.search(a.text[:40])
    m = re.search(r"CANCELLED AT \S*?T?(\d\d):(\d\d):(\d\d)", b.text)
    if ta is None or m is None:
        return None
    secs = lambda x: int(x[1]) * 3600 + int(x[2]) * 60 + int(x[3])  # noqa: E731
    return round(((secs(m) - secs(ta)) % 86400) / 60)


def _stuck_when_stopped(f: Finding, story: Story, line: LogLine) -> bool:
    """A launcher stopped from outside, after a stack dump showed where its workers stood
    (faulthandler, py-spy): the job had stopped making progress there before it was ended."""
    if f.details.get("family") != "launcher" or "SIG" not in f.summary:
        return False
    fs = story.files.get(line.file)
    if fs is None:
        return False
    dump = read_last_dump(fs.lines_before(line.lineno, 400))
    frames = dump.frames
    if not frames:
        if dump.torn:  # dumps were printed, and tore: say so, claim no frame
            f.summary += f"; before it, {torn_words(dump.heads)}"
            f.details["cause_before"] = {"rule": "stuck_then_stopped", "dump": "torn",
                                         "stacks": dump.heads}
        return False
    inner = next((fr for fr in frames if "/threading.py" not in fr["file"]), frames[0])
    user = next((fr for fr in frames if "site-packages" not in fr["file"]
                 and "/lib/python" not in fr["file"]), None)
    at = f"{inner['function']} ({short_path(inner['file'])}:{inner['line']})"
    if user is not None and user is not inner:
        at += f", called from {user['function']} ({short_path(user['file'])}:{user['line']})"
    f.summary += f"; before it, a stack dump showed the job stuck in {at}"
    f.details["cause_before"] = {"rule": "stuck_then_stopped", "frames": frames[:12]}
    f.callsites = [dict(user or inner)]
    return True
