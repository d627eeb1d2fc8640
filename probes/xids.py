"""NVIDIA's Xid events: how the driver prints them and what the common ones mean. Read by the
pre-launch check (the node's kernel log, check/kernel_xids.py) and by the log reader (an
Xid in a job's output, logs/families/xid.py).

The driver prints (open-gpu-kernel-modules, src/nvidia/src/kernel/gpu/rc/kernel_rc.c):

    NVRM: Xid (PCI:%04x:%02x:%02x): %d, pid=%s, name=%s, <message>
    NVRM: Xid (PCI:%04x:%02x:%02x): %d, <message>            (no process to name)

and a MIG GPU adds " GPU-I:%02u GPU-CI:%02u" inside the parenthesis.
"""

from __future__ import annotations

import re

KERNEL_XID = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:"
                        r"[0-9a-fA-F]{2})[^)]*\): (?P<xid>\d+), (?P<rest>.*)")

# What NVIDIA's Xid catalog says of the common ones, in three kinds: the GPU or its link
# failed (drain the node, reset the GPU or reboot); the GPU wants a reset when it is idle
# (a row to remap, a contained error that ended one application); or an application was
# at fault (a bad kernel, a killed process: the GPU itself may be fine).
DRAIN = {
    48: "double-bit ECC error", 61: "internal micro-controller breakpoint",
    62: "internal micro-controller halt", 64: "memory row remapping failed",
    74: "NVLink error", 79: "GPU has fallen off the bus", 95: "uncontained ECC error",
    119: "GSP RPC timeout", 120: "GSP error", 121: "C2C link error",
    140: "unrecovered ECC error", 154: "GPU recovery action changed (reset or reboot required)",
}
RESET_SOON = {
    63: "a memory row marked for remapping", 92: "high single-bit ECC error rate",
    94: "contained ECC error",
}
APPLICATION = {
    13: "graphics engine exception", 31: "GPU memory page fault",
    43: "GPU stopped processing", 45: "preemptive cleanup (a process was killed)",
    68: "video processor exception", 69: "graphics engine class error",
    109: "context switch timeout",
}


def meaning(xid: int) -> str:
    return (DRAIN.get(xid) or RESET_SOON.get(xid) or APPLICATION.get(xid)
            or "see NVIDIA's Xid catalog")
