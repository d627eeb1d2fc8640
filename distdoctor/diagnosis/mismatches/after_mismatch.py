"""What a collective mismatch makes the job print, said as the mismatch's consequence.

Ranks whose collectives disagree receive sizes they did not expect. Gloo aborts on
"received more data than the buffer holds"; or the rank allocates a buffer of the size a
peer sent (an all_gather of sizes before the data: Accelerate's pad_across_processes,
all_gather_object) and the CPU allocator fails on that size. The job's output then reads
as host memory exhausted, where the cause is the mismatch: a rank whose allocation failed
while inside the mismatched op, or a later op of that group, failed because of it. So
did one that raised just after it on what it received (the size of a buffer to pad to,
the bytes of an object to unpickle).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from distdoctor.findings import Finding, who

HOST_ALLOC = "host_alloc_failed"  # the log rule (logs/families/oom.py)


def is_host_alloc(f: Finding) -> bool:
    return f.details.get("source") == "log" and f.details.get("rule") == HOST_ALLOC


def alloc_in_mismatch(f: Finding, mismatches: list[Finding],
                      op_of: Callable[[int], tuple | None]) -> Finding | None:
    """`f` (a failed CPU allocation the job printed, or another exception it printed as a
    rank's crash: a storage size that overflowed, a pickle it could not load) as the
    consequence of the traced mismatch whose op, or a later op of its group, its ranks
    were in or had just left (`op_of(rank)`: (group, seq) of the rank's last op when it
    failed); None where none was."""
    if not f.ranks or f.details.get("source") != "log" or not (
            is_host_alloc(f) or (f.kind == "crash" and f.severity == "error")):
        return None
    for m in mismatches:
        if m.group is None or m.seq is None:
            continue
        ops = [op_of(r) for r in f.ranks]
        if all(op is not None and op[0] == m.group and op[1] >= m.seq for op in ops):
            if not is_host_alloc(f):  # any exception it raised there, said likewise
                return replace(f, severity="warning", summary=(
                    f"{f.summary} (inside or just after op #{ops[0][1]} in group "
                    f"{ops[0][0]}: a consequence of the mismatch at #{m.seq} in group "
                    f"{m.group}, whose sizes or dtypes it received)"),
                    remedy="Fix the mismatch reported with it first.",
                    details={**f.details, "consequence_of_mismatch": True})
            asked = f.details.get("requested")
            size = f" of {asked} bytes" if asked else ""
            group, seq = ops[0]
            return replace(
                f, severity="warning",
                summary=(f"{who(f.ranks)}: a CPU allocation{size} failed inside op #{seq} in "
                         f"group {group}, on a size received from a rank whose collective "
                         f"disagrees: a consequence of the mismatch at #{m.seq} in group "
                         f"{m.group}, not host memory exhausted"),
                remedy="Fix the mismatch reported with it; memory is not the cause.",
                details={**f.details, "consequence_of_mismatch": True,
                         "mismatch": m.summary[:300]})
    return None
