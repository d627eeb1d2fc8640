"""A slow rank that the job's own timeout ended: a straggler, not a hang.

Where one rank computes much longer than the others (a skewed sampler hands it a batch
ten times as long) and the job's process-group timeout is short, the others' collective
fails on that timeout while the rank is still computing. It never joined, but it was not
stuck: its progress (progress.py: CPU, its sampled line moving) says it was working.
Said as the straggler it is, with the timeout that ends the job; a rank with no sign of
progress stays a hang (hang.py).
"""

from __future__ import annotations

import re

from distdoctor.diagnosis.rendezvous import Rendezvous
from distdoctor.findings import Finding, callsite_of

# gloo: "Timed out waiting 6000ms for recv operation to complete"; NCCL's watchdog:
# "Watchdog caught collective operation timeout: WorkNCCL(...) ran for 600016
# milliseconds before timing out"
_TIMEOUT = re.compile(r"(?:Timed out waiting (\d+)\s*ms|ran for (\d+) milliseconds)")

REMEDY = ("The rank is slow, not stuck: even out the work per rank (a sampler or bucketing "
          "that gives one rank far longer batches, rank-0-only work inside the step), or "
          "give the process group a timeout longer than the slowest step "
          "(init_process_group(timeout=...)).")


def timeout_s(rv: Rendezvous) -> float | None:
    """The job's timeout that failed this collective, in seconds, where its error says."""
    for e in rv.arrivals.values():
        if e.status in ("error", "timeout"):
            m = _TIMEOUT.search(e.error or "")
            if m:
                return int(m.group(1) or m.group(2)) / 1000
            if e.status == "timeout" and e.t_end_ns:
                return (e.t_end_ns - e.t_enter_ns) / 1e9
    return None


def slow_past_timeout(rv: Rendezvous, roots: list[int], verdicts: dict, views
                      ) -> Finding | None:
    """The straggler finding where every rank missing from the timed-out `rv` was busy
    (its verdict a long wait), else None."""
    limit = timeout_s(rv)
    if limit is None or not roots or any(verdicts[r].state != "long_wait" for r in roots):
        return None
    failed = sorted(r for r, e in rv.arrivals.items() if e.status in ("error", "timeout"))
    first = rv.arrivals[failed[0]] if failed else next(iter(rv.arrivals.values()))
    who = ", ".join(map(str, roots))
    progress = {str(r): verdicts[r].why for r in roots}
    summary = (f"straggler: rank{'s' if len(roots) > 1 else ''} {who} still computing "
               f"({'; '.join(progress.values())}) when {first.op} #{rv.seq} in group "
               f"{rv.group} timed out on rank(s) {', '.join(map(str, failed))} after the "
               f"job's process-group timeout of {limit:g} s: slow, not stuck; that "
               f"timeout ends the job")
    callsites = [callsite_of(r, e.callsite) for r, e in sorted(rv.arrivals.items())][:4]
    for r in roots:
        v = views.get(r)
        if v is not None and v.latest is not None and v.latest.callsite:
            callsites.insert(0, callsite_of(r, v.latest.callsite))
    details = {"reason": "timeout_while_busy", "timeout_s": limit, "op": first.op,
               "waiting_ranks": failed, "progress": progress,
               "victims": failed}
    return Finding("straggler", "error", summary, list(roots), rv.group, rv.seq, callsites,
                   details=details, remedy=REMEDY)
