"""A GPU the driver reported as failed: an NVIDIA Xid in the job's output. Kernel messages
reach a job's log when a wrapper prints `dmesg`, a health check runs between steps, or a
user pastes them beside the traceback; the Xid comes before the CUDA errors the ranks then
raise, so it is the cause and they are its consequences.

- the driver's own line (probes/xids.py has the format and the catalog):
  `NVRM: Xid (PCI:0000:04:00): 79, pid=1234, name=python, GPU has fallen off the bus.`
- nvidia-smi on a GPU in that state: `GPU 00000000:04:00.0: Detected Critical Xid Error`
  (no number: the GPU cannot be queried further).
"""

from __future__ import annotations

import re

from distdoctor.findings import Finding
from distdoctor.logs.bounds import small_int
from distdoctor.logs.lines import LogLine
from distdoctor.logs.problems import Problem, on, plural, ranks_text
from distdoctor.logs.signals import CAUSE, CONTEXT, Family, Signal
from distdoctor.probes.xids import APPLICATION, DRAIN, KERNEL_XID, RESET_SOON, meaning

NAME = "xid"
AFTER_A_KILL = {45}  # preemptive cleanup: a consequence of a process killed, never a cause
_CRITICAL = re.compile(r"(?:GPU (?P<pci>[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}"
                       r"(?:\.\d)?):?\s*)?Detected Critical Xid Error")


class XidFamily(Family):
    name = NAME
    anchors = (b"Xid",)

    def feed(self, line: LogLine) -> list[Signal]:
        text = line.text
        # from the driver's first head only: searched, each head would start a scan for
        # its ")" to the line's end (a line of heads repeated costs its square)
        at = text.find("NVRM: Xid (")
        if at >= 0 and (m := KERNEL_XID.match(text, at)) and (xid := small_int(m["xid"])) \
                is not None:  # 45: the driver cleaning up after a process was killed
            return [Signal("xid", NAME, CONTEXT if xid in AFTER_A_KILL else CAUSE, line,
                           {"pci": m["pci"].lower(), "xid": xid})]
        if m := _CRITICAL.search(text):
            return [Signal("xid", NAME, CAUSE, line, {"pci": (m["pci"] or "").lower()})]
        return []


def prepare(causes: list[Problem]) -> list[Problem]:
    """The CUDA errors (and NCCL's) the ranks raised after an Xid are its consequences: one
    finding, the Xid's, which names the ranks that hit them (likely those on that GPU)."""
    xids = [p for p in causes if p.family == NAME]
    if not xids:
        return causes
    first = min(xids, key=lambda p: p.first.order)
    after = [p for p in causes if p.rule == "cuda_error" and p.first.order > first.first.order]
    first.first.fields["then"] = [(sorted(p.ranks), p.field("cuda") or "an error")
                                  for p in after]
    return [p for p in causes if p not in after]


def describe(p: Problem, ctx) -> Finding:
    f = p.fields()
    xid, pci = f.get("xid"), f.get("pci")
    gpu = f"the GPU at PCI {pci}" if pci else "a GPU"
    what = f"Xid {xid} ({meaning(xid)})" if xid is not None else "a critical Xid error"
    if xid in APPLICATION:
        kind = ("the program's own fault as the GPU saw it (a bad kernel or memory access); "
                "the GPU itself may be fine")
        remedy = ("Find the kernel that faulted: rerun with CUDA_LAUNCH_BLOCKING=1 and "
                  "compute-sanitizer on one rank; if the same GPU faults under other jobs, "
                  "have it checked.")
    else:
        kind = ("a failure of the GPU or its driver, not of the program"
                + ("; the GPU wants a reset when idle" if xid in RESET_SOON else "")
                + ("; drain the node" if xid in DRAIN or xid is None else ""))
        remedy = ("Take the node out of the pool and check the GPU (`nvidia-smi -q`, "
                  "`dmesg -T | grep Xid`, DCGM diagnostics); reset the GPU or reboot the node "
                  "before it runs a job again. The ranks' CUDA and NCCL errors after it are "
                  "its consequences.")
    where = on(sorted(p.ranks)) or (f" on {', '.join(sorted(p.hosts))}" if p.hosts else "")
    then = "; ".join(f"{'rank' + plural(r) + ' ' + ranks_text(r) if r else 'a rank'} then hit "
                     f"CUDA error: {cuda}" for r, cuda in f.get("then", [])[:4])
    then = f" ({then}: its consequence, on the failed GPU)" if then else ""
    return ctx.finding(p, "crash", "error", f"{gpu} reported {what}{where}: {kind}{then}", [],
                       remedy)
