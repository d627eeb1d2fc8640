"""A failure its process trained past. Frameworks catch an out-of-memory (CUDA's, or the host
allocator's "DefaultCPUAllocator: can't allocate memory") and go on, and log other
exceptions with their traceback (`logger.exception("could not upload metrics")`) and go on:
fairseq's trainer logs "OOM: Ran out of memory with exception: CUDA out of memory..." and
"attempting to recover from OOM", drops the batch and trains on; a user's `except
torch.OutOfMemoryError` does the same. Where the process that printed it then reported more
training steps, or said training finished, and nothing else in the log failed, the job did
not die of it: said as info, never an alarm. Read on the story's windows (story.py), after
the line-by-line pass.
"""

from __future__ import annotations

import re

from distdoctor.findings import Finding
from distdoctor.logs.families.progress import is_step_report
from distdoctor.logs.signals import EXIT, TEARDOWN, TIMEOUT, VICTIM, Signal
from distdoctor.logs.story import FINISHED, Story

MIN_STEPS_AFTER = 2  # step reports after it: one could be a line already on its way out
MAX_TEXT = 2000  # of a line searched for a step report
_CAUGHT = ("cuda_oom", "host_alloc_failed")  # what a framework catches and trains past
_RAISES = ("exception", "unknown")  # a Python exception's finding, known or not
# an uncaught exception's last line ("torch.OutOfMemoryError: CUDA out of memory..."): the
# process died of it, whatever other processes printed after it
_RAISED = re.compile(r"^\s*(?:[\w.]+\.)?\w*(?:Error|Exception)\s*:")
# what a log shows when a process failed, whatever the OOM line says: a launcher's exit
# report, its teardown, a timeout or lost peer (folded into the OOM's finding as consequences)
_FAILED = (EXIT, TEARDOWN, TIMEOUT, VICTIM)


def trained_past(found: list[Finding], story: Story, first_lines: dict,
                 signals: list[Signal]) -> None:
    """Demotes, in place, the one alarm of a log when its process caught it and trained
    past: an out-of-memory with two step reports or the end of training after it, any other
    exception (a metrics upload, a hook a framework logged with its traceback) only with the
    end of training after it (a rank that died of it would have stopped the job)."""
    loud = [f for f in found if f.severity in ("error", "warning")]
    if len(loud) != 1 or any(s.role in _FAILED for s in signals):
        return
    f = loud[0]
    oom = f.details.get("rule") in _CAUGHT
    if not oom and f.details.get("family") not in _RAISES:
        return
    line = first_lines.get(id(f))
    fs = story.files.get(line.file) if line is not None else None
    if fs is None or oom and _RAISED.match(line.text):
        return
    after = [ll for ll in fs.head + fs.tail if ll.lineno > line.lineno and ll.who == line.who]
    steps = sum(1 for ll in after if is_step_report(ll.text[:MAX_TEXT])) if oom else 0
    finished = any(m.kind == FINISHED and m.line.lineno > line.lineno
                   and m.line.who == line.who for m in fs.milestones)
    if steps < MIN_STEPS_AFTER and not finished:
        return
    f.severity = "info"
    said = f"{steps} step reports after it" if steps else "it said training finished"
    f.summary += (f" (caught: the process trained on past it, {said}; the batch was lost, "
                  f"not the job)" if oom else f" (caught: its process went on and {said})")
    f.details["trained_past"] = {"step_reports_after": steps, "finished": finished}
