"""The NCCL, gloo and torch.distributed variables of each rank, judged: legal values,
interface and HCA names that exist on the rank's node, and known-harmful settings.

Value sets are NCCL's documented ones (docs.nvidia.com, "Environment Variables", NCCL
2.2x) and torch's (torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp, torch 2.x).
"""

from __future__ import annotations

from functools import lru_cache

from distdoctor.check.known_names import KNOWN

BOOLEAN = {
    "NCCL_IB_DISABLE", "NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE", "NCCL_NET_GDR_READ",
    "NCCL_CUMEM_ENABLE", "NCCL_NVLS_ENABLE", "NCCL_IGNORE_CPU_AFFINITY",
    "NCCL_P2P_USE_CUDA_MEMCPY", "NCCL_COLLNET_ENABLE", "NCCL_IB_PCI_RELAXED_ORDERING",
    "NCCL_GRAPH_MIXING_SUPPORT", "NCCL_RUNTIME_CONNECT", "NCCL_IB_ADAPTIVE_ROUTING",
    "TORCH_NCCL_BLOCKING_WAIT", "TORCH_NCCL_DUMP_ON_TIMEOUT", "TORCH_NCCL_ENABLE_MONITORING",
    "TORCH_NCCL_ENABLE_TIMING", "TORCH_NCCL_AVOID_RECORD_STREAMS", "TORCH_NCCL_DESYNC_DEBUG",
    "TORCH_NCCL_USE_COMM_NONBLOCKING", "TORCH_NCCL_LOG_CPP_STACK_ON_UNCLEAN_SHUTDOWN",
    "NCCL_BLOCKING_WAIT", "NCCL_DESYNC_DEBUG",
}
# name -> (lowest, highest) for integers
INTEGER = {
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": (0, 3), "NCCL_ASYNC_ERROR_HANDLING": (0, 3),
    "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": (1, None), "TORCH_NCCL_TRACE_BUFFER_SIZE": (0, None),
    "TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC": (0, None), "NCCL_BUFFSIZE": (1, None),
    "NCCL_NTHREADS": (64, 512), "NCCL_MIN_NCHANNELS": (1, None),
    "NCCL_MAX_NCHANNELS": (1, None), "NCCL_SOCKET_NTHREADS": (1, 16),
    "NCCL_NSOCKS_PERTHREAD": (1, None), "NCCL_IB_TIMEOUT": (1, 31),
    "NCCL_IB_RETRY_CNT": (0, 7), "NCCL_IB_GID_INDEX": (-1, None), "NCCL_IB_TC": (0, 255),
    "NCCL_IB_SL": (0, 15), "NCCL_IB_QPS_PER_CONNECTION": (1, 128),
    "NCCL_CROSS_NIC": (0, 2), "NCCL_NET_GDR_C2C": (0, 1),
}
LEVELS = {"LOC", "NVL", "PIX", "PXB", "PHB", "SYS"}  # NCCL_P2P_LEVEL, NCCL_NET_GDR_LEVEL
ENUM = {
    "NCCL_DEBUG": {"VERSION", "WARN", "INFO", "TRACE", "ABORT"},
    "NCCL_SOCKET_FAMILY": {"AF_INET", "AF_INET6"},
    "NCCL_LAUNCH_MODE": {"PARALLEL", "GROUP"},
    "TORCH_DISTRIBUTED_DEBUG": {"OFF", "INFO", "DETAIL"},
}
# comma lists, each item optionally negated with ^ at the list's head
LISTS = {
    "NCCL_PROTO": {"LL", "LL128", "SIMPLE"},
    "NCCL_ALGO": {"RING", "TREE", "COLLNETDIRECT", "COLLNETCHAIN", "NVLS", "NVLSTREE", "PAT"},
    "NCCL_DEBUG_SUBSYS": {"INIT", "COLL", "P2P", "SHM", "NET", "GRAPH", "TUNING", "ENV",
                          "ALLOC", "CALL", "PROXY", "NVLS", "BOOTSTRAP", "REG", "PROFILE",
                          "RAS", "ALL"},
}
RENAMED = {"NCCL_BLOCKING_WAIT": "TORCH_NCCL_BLOCKING_WAIT",
           "NCCL_ASYNC_ERROR_HANDLING": "TORCH_NCCL_ASYNC_ERROR_HANDLING",
           "NCCL_DESYNC_DEBUG": "TORCH_NCCL_DESYNC_DEBUG"}


def problems(name: str, value: str) -> list[tuple[str, str, str]]:
    """(status, what is wrong, remedy) for one variable's value, names aside."""
    out = []
    v = value.strip()
    meant = misspelt(name)
    if meant:
        out.append(("warn", f"{name} is not a variable NCCL or torch reads: as set it changes "
                    f"nothing (did you mean {meant}?)", f"rename it {meant}"))
    if name in RENAMED:
        out.append(("warn", f"{name} is the old name of {RENAMED[name]}",
                    f"set {RENAMED[name]} instead (torch reads the old name with a warning "
                    f"and may stop)"))
    if name in BOOLEAN and v not in ("0", "1"):
        out.append(("fail", f"{name}={value!r} is not 0 or 1", f"set {name} to 0 or 1"))
    elif name in INTEGER:
        lo, hi = INTEGER[name]
        try:
            n = int(v)
            if (lo is not None and n < lo) or (hi is not None and n > hi):
                raise ValueError
        except ValueError:
            span = f"{lo}..{hi}" if hi is not None else f">= {lo}"
            out.append(("fail", f"{name}={value!r} is not an integer in {span}",
                        f"set {name} to an integer in {span}"))
    elif name in ENUM and v.upper() not in ENUM[name]:
        out.append(("fail", f"{name}={value!r} is not one of {', '.join(sorted(ENUM[name]))}",
                    f"set {name} to one of them"))
    elif name in ("NCCL_P2P_LEVEL", "NCCL_NET_GDR_LEVEL") and not (
            v.upper() in LEVELS or v.isdigit()):
        out.append(("fail", f"{name}={value!r} is not a level ({', '.join(sorted(LEVELS))})",
                    f"set {name} to a level or unset it"))
    elif name in LISTS:
        items = [i.strip().upper() for i in v.lstrip("^").split(",") if i.strip()]
        bad = [i for i in items if i not in LISTS[name]]
        if bad or not items:
            out.append(("fail", f"{name}={value!r}: {', '.join(bad) or 'empty'} not known "
                        f"(known: {', '.join(sorted(LISTS[name]))})", f"fix or unset {name}"))
    out.extend(_harmful(name, v))
    return out


@lru_cache(maxsize=1024)  # every rank of a job has the same few names
def misspelt(name: str) -> str | None:
    """The known name `name` is one or two keystrokes from, when it is not one itself
    (names far from every known one may be a plugin's: not judged)."""
    if name in KNOWN:
        return None
    most = 1 if len(name) < 14 else 2
    near = [(d, k) for k in KNOWN if abs(len(k) - len(name)) <= most
            and (d := _edits(name, k, most)) <= most]
    if not near:
        return None
    near.sort()
    if len(near) > 1 and near[1][0] == near[0][0]:
        return None  # two names as close: no guess
    return near[0][1]


def _edits(a: str, b: str, most: int) -> int:
    """Edit distance (insert, delete, replace, swap two neighbours), or most + 1 once it
    is past `most`."""
    prev2, prev = None, list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        row = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            row[j] = min(prev[j] + 1, row[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1]))
            if (prev2 is not None and i > 1 and j > 1 and a[i - 1] == b[j - 2]
                    and a[i - 2] == b[j - 1]):
                row[j] = min(row[j], prev2[j - 2] + 1)
        if min(row) > most:
            return most + 1
        prev2, prev = prev, row
    return prev[-1]


def _harmful(name: str, v: str) -> list[tuple[str, str, str]]:
    if name == "NCCL_DEBUG" and v.upper() == "TRACE":
        return [("warn", "NCCL_DEBUG=TRACE logs every call: slow, and gigabytes of log",
                 "use NCCL_DEBUG=INFO (or WARN) outside a debugging session")]
    if name == "TORCH_DISTRIBUTED_DEBUG" and v.upper() == "DETAIL":
        return [("warn", "TORCH_DISTRIBUTED_DEBUG=DETAIL checks every collective with an "
                 "extra one: a debugging setting that slows training",
                 "unset it (or INFO) for production runs")]
    if name in ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_ASYNC_ERROR_HANDLING") and v == "0":
        return [("warn", f"{name}=0: a failed or timed-out collective leaves the job hanging "
                 "instead of ending it", f"unset {name} (torch's default, 3) or set 1")]
    if name in ("NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE") and v == "1":
        return [("warn", f"{name}=1 sends traffic between GPUs of one node another, slower "
                 "way", f"unset {name} unless it works around a known fault")]
    return []


def pairs(settings: dict) -> list[tuple[str, str, str]]:
    """(status, what, remedy) of settings that are wrong together on one rank."""
    out = []
    blocking = settings.get("TORCH_NCCL_BLOCKING_WAIT") or settings.get("NCCL_BLOCKING_WAIT")
    asynch = (settings.get("TORCH_NCCL_ASYNC_ERROR_HANDLING")
              or settings.get("NCCL_ASYNC_ERROR_HANDLING"))
    if blocking == "1" and asynch not in (None, "0"):
        out.append(("warn", "TORCH_NCCL_BLOCKING_WAIT=1 and TORCH_NCCL_ASYNC_ERROR_HANDLING "
                    "are both set: blocking wait takes precedence",
                    "keep one (async error handling, torch's default)"))
    return out


def interface_problem(name: str, value: str, interfaces: list[str] | None,
                      multi_node: bool) -> tuple[str, str, str] | None:
    """NCCL_SOCKET_IFNAME (prefixes; =exact; ^excluded) or GLOO_SOCKET_IFNAME (exact
    names) against the node's interfaces."""
    if interfaces is None:
        return None
    v = value.strip()
    if name == "GLOO_SOCKET_IFNAME":
        wanted = [i.strip() for i in v.split(",") if i.strip()]
        missing = [i for i in wanted if i not in interfaces]
        matched = [i for i in wanted if i in interfaces]
        if missing:
            return ("fail", f"{name}={value!r}: no interface {', '.join(missing)} on this node "
                    f"(it has {', '.join(interfaces)}): gloo fails in init_process_group",
                    f"set {name} to the interface the nodes reach each other through (one "
                    f"of {', '.join(i for i in interfaces if i != 'lo') or 'lo'}), or unset "
                    f"it to let gloo pick")
    else:
        exclude = v.startswith("^")
        body = v[1:] if exclude else v
        exact = body.startswith("=")
        items = [i.strip() for i in body.lstrip("=").split(",") if i.strip()]

        def hit(iface: str) -> bool:
            return any(iface == i if exact else iface.startswith(i) for i in items)

        matched = [i for i in interfaces if hit(i) != exclude]
        if not matched:
            return ("fail", f"{name}={value!r} matches no interface on this node (it has "
                    f"{', '.join(interfaces)}): NCCL's bootstrap finds no socket interface",
                    f"set {name} to this node's NIC (a prefix like 'eth' or '=ens5'), or "
                    f"unset it to let NCCL pick")
    if multi_node and matched and all(i == "lo" or i.startswith("lo") for i in matched):
        return ("fail", f"{name}={value!r} picks only the loopback interface: other nodes "
                "cannot reach this one through it", f"set {name} to the node's network NIC")
    return None


def hca_problem(value: str, hcas: list[str] | None) -> tuple[str, str, str] | None:
    """NCCL_IB_HCA (device[:port] items; prefixes unless =; ^ excludes) against the
    node's RDMA devices."""
    v = value.strip()
    if v.startswith("^"):
        return None  # an exclusion list cannot name a device that is missing
    exact = v.startswith("=")
    items = [i.strip().split(":")[0] for i in v.lstrip("=").split(",") if i.strip()]
    have = hcas or []
    missing = [i for i in items
               if not any(h == i if exact else h.startswith(i) for h in have)]
    if missing:
        return ("fail", f"NCCL_IB_HCA={value!r}: no RDMA device {', '.join(missing)} on this "
                f"node (it has {', '.join(have) or 'none'})",
                "set NCCL_IB_HCA to this node's devices (ibv_devices lists them)")
    return None
