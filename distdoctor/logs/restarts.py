"""torchelastic restarts and membership changes, folded into the findings (for reasoning.py).

torchrun with `--max-restarts N` restarts the whole worker group when a rank fails ("Worker
group FAILED. 1/2 attempts left; will restart worker group") and when nodes join or leave
("Detected 1 new nodes from group_rank=0; will restart worker group"). The failure before a
restart is still the cause; the finding says the group was restarted, and whether the log
shows it failing again. A failure the restarted group never repeated is a warning: the job
went on. A membership change alone is no failure (info).

Format: torch/distributed/elastic/agent/server/api.py (torch 2.0-2.13; printed at INFO:
`LOGLEVEL=INFO torchrun ...`).
"""

from __future__ import annotations

from distdoctor.findings import Finding
from distdoctor.logs.problems import clip
from distdoctor.logs.signals import Signal


def fold_restarts(out: list[tuple[int, Finding]], restarts: list[Signal]) -> None:
    if not restarts:
        return
    restarts = sorted(restarts, key=lambda s: s.order)
    failed = [s for s in restarts if s.rule == "restart"]
    joined = [s for s in restarts if s.rule == "membership"]
    errors = sorted((t for t in out if t[1].severity == "error"), key=lambda t: t[0])
    if failed:
        first, last = failed[0].order, failed[-1].order
        before = [t for t in errors if t[0] < first]
        after = [t for t in errors if t[0] > last]
        n = len(failed)
        f = failed[-1].fields
        left = (f" ({f['left']}/{f['max']} attempts left)"
                if "left" in f and "max" in f else "")
        said = f"torchelastic restarted the worker group {n} time{'s' if n > 1 else ''}{left}"
        if before:
            top = before[0][1]
            top.details["restarts"] = n
            if after:
                again = after[0][1]
                top.summary += (f"; {said}, and it failed again: {clip(again.summary, 160)}"
                                if again is not top else f"; {said}")
            else:
                top.summary += f"; {said} and it ran on: no failure after the restart in this log"
                for _, g in before:
                    g.severity = "warning"
            return
        if not errors:
            out.append((failed[0].order, Finding(
                "crash", "warning", f"the worker group failed and {said}; what failed is not in "
                f"this log (its ranks' output or torchrun's report of them)", ranks=[],
                remedy="Read each rank's output (torchrun --tee 3 / --log-dir) for the failure "
                       "before the restart.",
                details=_details(failed))))
        return
    if joined and not errors:
        n = sum(s.fields.get("new", 1) for s in joined)
        out.append((joined[0].order, Finding(
            "host", "info", f"the worker group restarted after a membership change ({n} new "
            f"node{'s' if n > 1 else ''} joined): not a failure", ranks=[], remedy=None,
            details=_details(joined))))


def _details(signals: list[Signal]) -> dict:
    return {"signature": f"log/elastic/{signals[0].rule}", "source": "log",
            "family": "launcher", "rule": signals[0].rule, "restarts": len(signals),
            "lines": [s.line.text[:300] for s in signals[:3]]}
