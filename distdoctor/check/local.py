"""The checks that need no communication, made on this node before any rank starts: the
NCCL/gloo variables' values and the interfaces and RDMA devices they name, /dev/shm, the
limits, memory and the checkpoint directory. A mistake here (GLOO_SOCKET_IFNAME naming no
interface) would otherwise surface as the ranks' raw start-up error.

The rows are the same ones the ranks' own facts give (rules.py judges both), so a node
whose ranks run later is not reported twice.
"""

from __future__ import annotations

import os
import socket

from distdoctor.check import facts, rules
from distdoctor.check.table import Row

# variables whose fail stops every rank's init_process_group: no point starting them
BLOCKING = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


def node_facts(env: dict, checkpoint_dir: str | None) -> dict:
    """What this node shows without torch and without the other ranks."""
    return {
        "rank": 0, "local_rank": 0, "host": socket.gethostname(),
        "settings": {k: v for k, v in env.items() if k.startswith(facts.SETTING_PREFIXES)},
        "interfaces": facts._safe(lambda: sorted(n for _, n in socket.if_nameindex())),
        "hcas": facts._listdir("/sys/class/infiniband"),
        "shm": facts.disk(env.get(facts.SHM_ENV) or "/dev/shm"),
        "checkpoint": (facts.disk(checkpoint_dir, write=True) if checkpoint_dir else None),
        "limits": {"nofile": facts._limit(facts.resource.RLIMIT_NOFILE),
                   "memlock": facts._limit(facts.resource.RLIMIT_MEMLOCK)},
        "memory": facts._memory(),
    }


def rows(env: dict | None = None, checkpoint_dir: str | None = None,
         multi_node: bool = False) -> list[Row]:
    """This node's rows, before any rank starts (the one-rank "same settings" row aside)."""
    f = node_facts(dict(os.environ if env is None else env), checkpoint_dir)
    out = [r for r in rules.settings_rows([f], multi_node) if r.check != "same settings"]
    out += _without_address(f)
    return out + rules.node_rows([f], multi_node)


def _without_address(f: dict) -> list[Row]:
    """GLOO_SOCKET_IFNAME naming an interface that exists but has no IP address (down, or
    never configured): gloo's "Unable to find address for" at every rank's init."""
    value = f["settings"].get("GLOO_SOCKET_IFNAME")
    if not value:
        return []
    try:
        import psutil

        addrs = psutil.net_if_addrs()
    except Exception:
        return []
    ip = (socket.AF_INET, socket.AF_INET6)
    bare = [i.strip() for i in value.split(",") if i.strip() in addrs
            and not any(a.family in ip for a in addrs[i.strip()])]
    if not bare:
        return []
    usable = [n for n, a in sorted(addrs.items()) if n != "lo" and any(x.family in ip for x in a)]
    return [Row("setting valid", f"node {f['host']}", "fail",
                f"GLOO_SOCKET_IFNAME={value!r}: interface {', '.join(bare)} has no IP address "
                f"on this node: gloo fails in init_process_group",
                f"set GLOO_SOCKET_IFNAME to an interface with an address (one of "
                f"{', '.join(usable) or 'lo'}), or unset it")]


def blocking(found: list[Row]) -> list[Row]:
    """The failed rows that would make every rank's start-up fail the same way (NCCL's
    interface only where NCCL will run: a node with an NVIDIA driver)."""
    names = BLOCKING if os.path.exists("/dev/nvidiactl") else ("GLOO_SOCKET_IFNAME",)
    return [r for r in found if r.status == "fail" and r.check == "setting valid"
            and r.found.split("=", 1)[0] in names]


def merge(before: list[Row], after: list[Row]) -> list[Row]:
    """The ranks' rows with the ones already made here before they started left out."""
    seen = {(r.check, r.scope, r.status, r.found) for r in before}
    return before + [r for r in after if (r.check, r.scope, r.status, r.found) not in seen]
