"""NCCL's WARN lines that are harmless (a plugin that is not installed, a PCI path a VM hides,
its choice of interface), and what a fatal one no rule names was about. Read by nccl.py on a
WARN's message (its first 200 characters).

Linear: a WARN is anyone's text, so each "X.*?Y" is read as `then(X) + "Y"` (signals.py).
"""

from __future__ import annotations

import re

from distdoctor.logs.signals import then

# WARN lines that do not mean anything is wrong: a plugin that is not installed, a PCI path
# NCCL could not resolve in a VM or container, its choice of interface or transport.
BENIGN_WARN = re.compile(
    r"NET/Plugin|[Nn]o plugin found|libnccl-net|Could not find real path|"
    r"NCCL_\w{1,64} set by environment|Using network|NVLS|[Mm]ulticast|"
    r"NET/IB : No device found|Failed to open libibverbs|No IB devices|"
    r"Missing \"iommu=pt\"|CUDA Driver Version|" + then("pci") + "path|"
    + then("topo") + r"(?:speed|width)|"
    + then("Could not (?:get|find) ") + r"(?:sysfs|numa|cpu)|"
    + then("setting ") + r"affinity|NCCL_P2P_LEVEL|"
    r"\[Service thread\] Accept failed|GID table change|Ignoring unknown")
# WARNs harmless even when a return code follows them (NCCL tries another way)
ALWAYS_BENIGN = re.compile(r"NET/Plugin|[Nn]o plugin found|libnccl-net|"
                           r"NCCL_\w{1,64} set by environment|"
                           r"NVLS|[Mm]ulticast|\[Service thread\]|GID table change|"
                           r"Ignoring unknown|Failed to open libibverbs|No IB devices")
# what a fatal WARN that no rule names was about: the PCI tree NCCL read under /sys
TOPOLOGY = re.compile(r"real path|/sys/|[Tt]opo|pci|PCI|numa|xml")
