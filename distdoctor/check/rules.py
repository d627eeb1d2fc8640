"""The rows of `distdoctor check`, judged from every rank's facts (rank.py's JSON).

Sameness checks name the ranks that differ from the most common value; node checks are
made once per node (its local rank 0 speaks for it); thresholds are the usual advice for
NCCL jobs, each said in its row.
"""

from __future__ import annotations

from collections import Counter

from distdoctor.check import kernel_xids
from distdoctor.check import settings as S
from distdoctor.check.table import Row
from distdoctor.diagnosis.report import rank_ranges
from distdoctor.tracer.support import FLOOR, below_floor

GiB = 1 << 30
SHM_FAIL, SHM_WARN = 256 << 20, 1 * GiB  # Docker's default is 64 MB
CHECKPOINT_FAIL = 1 * GiB
NOFILE_WARN = 4096
MEMORY_WARN = 0.10  # of the node's memory available
CLOCK_WARN_S, CLOCK_FAIL_S = 0.05, 1.0
TEMP_MARGIN_C = 5  # of the slowdown threshold


def rows(job: dict, multi_node: bool) -> list[Row]:
    ranks = job["ranks"]
    out = []
    out += _versions(ranks)
    out += _settings(ranks, multi_node)
    out += _per_node(ranks, multi_node)
    out += _devices(ranks)
    out += _gpus(ranks)
    out += _clock(ranks, job.get("clock_offsets_s") or [])
    out += _all_reduce(job.get("all_reduce") or [])
    out += _sweep(ranks, job.get("sweep"))
    return out


def _nodes(ranks: list[dict]) -> dict[str, list[dict]]:
    by: dict[str, list[dict]] = {}
    for f in ranks:
        by.setdefault(f["host"], []).append(f)
    return by


def _odd_ones(values: dict[int, object]) -> tuple[object, list[int]]:
    """(the most common value, the ranks with another)."""
    common = Counter(map(repr, values.values())).most_common(1)[0][0]
    usual = next(v for v in values.values() if repr(v) == common)
    return usual, sorted(r for r, v in values.items() if repr(v) != common)


# --- sameness ------------------------------------------------------------------------------
def _versions(ranks: list[dict]) -> list[Row]:
    out = []
    for what in ("python", "torch", "cuda", "nccl", "cudnn"):
        values = {f["rank"]: f["versions"].get(what) for f in ranks}
        usual, odd = _odd_ones(values)
        if odd:
            seen = ", ".join(f"{values[r]} on rank {r} ({_host(ranks, r)})" for r in odd[:4])
            out.append(Row(f"{what} version", f"ranks {rank_ranges(odd)}", "fail",
                           f"{usual} on most ranks but {seen}",
                           "install the same build on every node (one container image)"))
        elif usual is None:
            out.append(Row(f"{what} version", "job", "n/a", "not in this build (CPU torch)"))
        elif what == "torch" and (too_old := below_floor(str(usual))) is not None:
            out.append(Row("torch version", "job", "warn", f"{too_old}: the job runs untraced",
                           f"torch >= {FLOOR[0]}.{FLOOR[1]} is traced; older runs untouched"))
        else:
            out.append(Row(f"{what} version", "job", "ok", f"{usual} on every rank"))
    return out


def settings_rows(ranks: list[dict], multi_node: bool) -> list[Row]:
    """The NCCL/gloo variables: alike on every rank, legal, naming what exists."""
    return _settings(ranks, multi_node)


def node_rows(ranks: list[dict], multi_node: bool) -> list[Row]:
    """/dev/shm, the checkpoint directory, limits and memory, once per node."""
    return _per_node(ranks, multi_node)


def _settings(ranks: list[dict], multi_node: bool) -> list[Row]:
    out = []
    names = sorted({k for f in ranks for k in f["settings"]})
    for name in names:
        values = {f["rank"]: f["settings"].get(name) for f in ranks}
        usual, odd = _odd_ones(values)
        if odd:
            seen = ", ".join(f"{values[r]!r} on rank {r}" for r in odd[:4])
            out.append(Row("same settings", f"ranks {rank_ranges(odd)}", "fail",
                           f"{name}={usual!r} on most ranks but {seen}"
                           if usual is not None else f"{name} unset on most ranks but {seen}",
                           f"set {name} alike on every rank (the launcher's environment, not "
                           f"a per-node script)"))
    if not names:
        out.append(Row("same settings", "job", "ok", "no NCCL_/GLOO_/TORCH_NCCL_ variable set"))
    elif not out:
        out.append(Row("same settings", "job", "ok",
                       f"{len(names)} variable(s) alike on every rank: {', '.join(names)}"))
    bad = 0
    for host, fs in _nodes(ranks).items():
        f = fs[0]
        seen = set()
        for name, value in sorted(f["settings"].items()):
            found = list(S.problems(name, value))
            if name in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"):
                p = S.interface_problem(name, value, f["interfaces"], multi_node)
                found += [p] if p else []
            if name == "NCCL_IB_HCA":
                p = S.hca_problem(value, f["hcas"])
                found += [p] if p else []
            if name == "NCCL_IB_DISABLE" and value == "1" and multi_node and f["hcas"]:
                found.append(("warn", "NCCL_IB_DISABLE=1 on nodes with RDMA devices: NCCL "
                              "falls back to TCP sockets", "unset NCCL_IB_DISABLE"))
            for status, what, remedy in found + S.pairs(f["settings"]):
                if what not in seen:
                    seen.add(what)
                    bad += 1
                    out.append(Row("setting valid", f"node {host}", status, what, remedy))
    if names and not bad:
        out.append(Row("setting valid", "job", "ok", "every value legal; interfaces and HCAs "
                       "named exist on their nodes"))
    return out


# --- per node -----------------------------------------------------------------------------
def _per_node(ranks: list[dict], multi_node: bool) -> list[Row]:
    out = []
    for host, fs in _nodes(ranks).items():
        f, scope = fs[0], f"node {host}"
        out.append(_shm(f.get("shm"), scope))
        if f.get("checkpoint") is not None:
            out.append(_checkpoint(f["checkpoint"], scope))
        out.append(_nofile(f["limits"]["nofile"], scope))
        out.append(_memlock(f["limits"]["memlock"], f.get("hcas"), scope))
        out.append(_memory(f.get("memory"), scope))
    return out


def _shm(shm: dict | None, scope: str) -> Row:
    if not shm or shm.get("total") is None:
        return Row("/dev/shm", scope, "fail", "no /dev/shm to read",
                   "mount a tmpfs at /dev/shm (docker: --ipc=host or --shm-size=8g)")
    size = shm["total"]
    where = "" if shm["path"] == "/dev/shm" else f" ({shm['path']})"
    if size < SHM_FAIL:
        return Row("/dev/shm", scope, "fail", f"{_size(size)}{where}: NCCL's shared-memory "
                   f"transport between GPUs of a node needs more (Docker's default is 64 MB)",
                   "docker: --ipc=host or --shm-size=8g; Kubernetes: an emptyDir of medium "
                   "Memory at /dev/shm")
    status = "warn" if size < SHM_WARN else "ok"
    return Row("/dev/shm", scope, status, f"{_size(size)}{where}, {_size(shm['free'])} free",
               "--shm-size=8g or --ipc=host" if status == "warn" else "")


def _checkpoint(c: dict, scope: str) -> Row:
    path = c["path"]
    if not c.get("exists"):
        return Row("checkpoint dir", scope, "fail", f"{path} does not exist",
                   "create it (on storage every node can write) before the job starts")
    if c.get("writable") is False:
        return Row("checkpoint dir", scope, "fail", f"{path} is not writable "
                   f"({c.get('error', '?')})", "fix its permissions, or free space on it")
    free = c.get("free")
    if free is not None and free < CHECKPOINT_FAIL:
        return Row("checkpoint dir", scope, "fail", f"{path}: {_size(free)} free of "
                   f"{_size(c['total'])}: the first checkpoint will not fit",
                   "free space or point --checkpoint-dir elsewhere")
    return Row("checkpoint dir", scope, "ok", f"{path}: {_size(free)} free, writable")


def _nofile(limit: list, scope: str) -> Row:
    soft, hard = limit
    if soft is not None and soft < NOFILE_WARN:
        return Row("open files limit", scope, "warn", f"{soft} (hard {hard or 'unlimited'}): "
                   f"NCCL and gloo open sockets and files per peer",
                   "ulimit -n 65536 (or LimitNOFILE in the unit that starts the job)")
    return Row("open files limit", scope, "ok", f"{soft or 'unlimited'}")


def _memlock(limit: list, hcas, scope: str) -> Row:
    soft = limit[0]
    if not hcas:
        return Row("memlock limit", scope, "n/a",
                   f"{soft or 'unlimited'} (no RDMA device: nothing to pin)")
    if soft is not None:
        return Row("memlock limit", scope, "fail", f"{soft} bytes: RDMA (InfiniBand, RoCE) "
                   f"must pin its buffers", "ulimit -l unlimited (docker: --ulimit memlock=-1)")
    return Row("memlock limit", scope, "ok", "unlimited")


def _memory(mem: dict | None, scope: str) -> Row:
    if not mem:
        return Row("host memory", scope, "n/a", "not readable")
    share = mem["available"] / mem["total"] if mem["total"] else 0.0
    text = f"{_size(mem['available'])} available of {_size(mem['total'])}"
    if share < MEMORY_WARN:
        return Row("host memory", scope, "warn", f"{text}: something else holds the rest",
                   "find the processes holding it (a job from before?) before starting")
    return Row("host memory", scope, "ok", text)


# --- devices and GPUs ---------------------------------------------------------------------
def _devices(ranks: list[dict]) -> list[Row]:
    out = []
    for host, fs in _nodes(ranks).items():
        claims: dict[str, list[int]] = {}
        for f in fs:
            d = f["device"]
            key = d.get("uuid") or d.get("physical")
            if d.get("exists") is False:
                out.append(Row("device", f"rank {f['rank']}", "fail",
                               f"local rank {f['local_rank']} wants GPU {d.get('ordinal')} but "
                               f"CUDA_VISIBLE_DEVICES={f['cuda_visible_devices']!r} and "
                               f"{d.get('count', 0)} visible",
                               "give each rank one existing GPU (torchrun sets LOCAL_RANK; "
                               "leave CUDA_VISIBLE_DEVICES to the node's scheduler)"))
            elif key is not None:
                claims.setdefault(str(key), []).append(f["rank"])
        for key, rs in claims.items():
            if len(rs) > 1:
                out.append(Row("device", f"node {host}", "fail",
                               f"ranks {rank_ranges(rs)} all use GPU {key} "
                               f"(CUDA_VISIBLE_DEVICES={fs[0]['cuda_visible_devices']!r}): "
                               f"NCCL stops with 'Duplicate GPU detected'",
                               "one GPU per rank: unset CUDA_VISIBLE_DEVICES per rank, or set "
                               "it to the rank's own GPU"))
        affinity = [_affinity(f) for f in fs]
        out += [a for a in affinity if a is not None]
    if not out:
        gpus = [f for f in ranks if f["device"].get("uuid") or f["device"].get("physical")]
        out.append(Row("device", "job", "ok" if gpus else "n/a",
                       f"each of {len(gpus)} ranks on its own GPU" if gpus else
                       "no GPU: CPU ranks (gloo)"))
    return out


def _affinity(f: dict) -> Row | None:
    d = f["device"]
    cpus, mine = d.get("numa_cpus"), f.get("affinity")
    if not cpus or not mine:
        return None
    if not set(mine) & set(cpus):
        return Row("CPU affinity", f"rank {f['rank']}", "warn",
                   f"its CPUs ({rank_ranges(mine)}) are all off its GPU's NUMA node "
                   f"{d['numa_node']} ({rank_ranges(cpus)}): every copy crosses sockets",
                   "bind each rank to its GPU's NUMA node (numactl, or torchrun --numa-binding)")
    return None


def _gpus(ranks: list[dict]) -> list[Row]:
    out = []
    for host, fs in _nodes(ranks).items():
        node = next((f.get("node_gpus") for f in fs if "node_gpus" in f), None)
        log = next((f.get("kernel_xids") for f in fs if "kernel_xids" in f), None)
        scope = f"node {host}"
        if node is None:
            out.append(Row("GPU health", scope, "n/a", "no NVIDIA driver on this node"))
        elif "error" in node:
            out.append(Row("GPU health", scope, "warn", f"NVML could not be read: "
                           f"{node['error']}", "nvidia-smi on the node says why"))
        else:
            for g in node["gpus"]:
                out += _gpu(g, scope)
        gpus = node.get("gpus", []) if node is not None else None  # [] if NVML failed
        out += kernel_xids.rows(log, gpus, scope)
    return out


def _gpu(g: dict, scope: str) -> list[Row]:
    replay = "" if g.get("source") == "live" else " (replayed NVML readings)"
    where = f"{scope} GPU {g['index']}"
    bad = []
    t, slow = g.get("temperature_c"), g.get("slowdown_c")
    if t is not None and slow is not None and t >= slow - TEMP_MARGIN_C:
        bad.append(("fail" if t >= slow else "warn",
                    f"{t} C at idle, slowdown at {slow} C", "check its cooling before the job"))
    reasons = [r for r in g.get("reasons") or [] if r not in ("gpu_idle", "none")]
    if reasons:
        bad.append(("warn", f"clocks held down by {', '.join(reasons)} "
                    f"({g.get('sm_clock_mhz')} of {g.get('max_sm_clock_mhz')} MHz)",
                    "see nvidia-smi -q -d PERFORMANCE; a thermal or power reason at idle "
                    "is a hardware or cooling fault"))
    if g.get("ecc_uncorrected"):
        bad.append(("fail", f"{g['ecc_uncorrected']} uncorrected ECC errors",
                    "drain the node; reset the GPU or have it replaced"))
    if g.get("remap_failed") or g.get("retired_pending"):
        bad.append(("fail", "memory row remapping failed or pages await retirement",
                    "reset the GPU (pending remaps apply at reset); replace it if it fails"))
    if g.get("xids"):
        bad.append(("fail", f"XID events {g['xids']}", "look the XIDs up in NVIDIA's XID "
                    "catalog; most need a node drain"))
    if g.get("persistence") == 0:
        bad.append(("warn", "persistence mode off: each process start re-initialises the "
                    "driver (seconds per rank)", "nvidia-smi -pm 1"))
    if not bad:
        return [Row("GPU health", where, "ok",
                    f"{g.get('name')}: {t} C, {g.get('sm_clock_mhz')} MHz, no ECC, remap or "
                    f"XID errors{replay}")]
    return [Row("GPU health", where, s, what + replay, remedy) for s, what, remedy in bad]


# --- together -------------------------------------------------------------------------------
def _clock(ranks: list[dict], offsets: list[float]) -> list[Row]:
    if not offsets:
        return []
    hosts = {}
    for f in ranks:
        if f["rank"] is not None and f["rank"] < len(offsets):
            hosts.setdefault(f["host"], []).append(offsets[f["rank"]])
    node = {h: sorted(v)[len(v) // 2] for h, v in hosts.items()}
    worst = max(node, key=lambda h: abs(node[h]))
    off = node[worst]
    text = (f"node {worst} is {off * 1e3:+.1f} ms from rank 0's clock"
            if len(node) > 1 else f"one node: ranks within {max(map(abs, offsets)) * 1e3:.1f} ms")
    status = ("fail" if abs(off) >= CLOCK_FAIL_S else "warn" if abs(off) >= CLOCK_WARN_S
              else "ok")
    return [Row("clock offset", "job", status, text,
                "run chrony or NTP on every node: an offset skews every log and trace"
                if status != "ok" else "")]


def _all_reduce(results: list[dict]) -> list[Row]:
    if not results:
        return []
    wrong = [r for r, x in enumerate(results) if not x.get("ok")]
    if wrong:
        worst = max(results[r].get("max_error", 0.0) for r in wrong)
        return [Row("all_reduce result", f"ranks {rank_ranges(wrong)}", "fail",
                    f"the sum came back wrong (off by up to {worst:g})",
                    "a faulty GPU, NIC or driver: run nccl-test -c 1 on these ranks' nodes")]
    return [Row("all_reduce result", "job", "ok",
                f"1 MiB summed over {len(results)} ranks, exact on every rank")]


def _sweep(ranks: list[dict], sweep: dict | None) -> list[Row]:
    """The slow pairs as `nccl-test --pairwise` judges them (pairwise_report.analyze)."""
    if not sweep:
        return []
    from distdoctor.check.links import SLOW_PAIR, SWEEP_ITERS
    from distdoctor.nccltest.pairwise_report import analyze
    from distdoctor.nccltest.results import RankInfo

    by_rank = {f["rank"]: f for f in ranks}
    infos = [RankInfo(r, by_rank[r].get("local_rank") or 0, by_rank[r]["host"],
                      by_rank[r]["pid"], "cpu", "", by_rank[r]["device"].get("pci") or "-")
             for r in range(len(sweep["gbps"]))]
    found = analyze(sweep["gbps"], sweep["latency_us"], infos, SLOW_PAIR, sweep["bytes"],
                    SWEEP_ITERS)
    median = found["median_gbps"]
    if not found["slow_pairs"]:
        n = len(infos)
        return [Row("pairwise bandwidth", "job", "ok",
                    f"{n * (n - 1)} directed pairs, median {median:.2f} GB/s, none below "
                    f"{SLOW_PAIR:.0%} of it ({_size(sweep['bytes'])} transfers)")]
    out = []
    for p in sorted(found["slow_pairs"], key=lambda p: p["gbps"])[:8]:
        out.append(Row("pairwise bandwidth", f"pair {p['src']}->{p['dst']}", "warn",
                       f"{p['gbps']:.2f} GB/s, {p['fraction_of_median']:.0%} of the median "
                       f"pair's {median:.2f} ({p['src_host']} -> {p['dst_host']})",
                       "nccl-test --pairwise on these nodes; check the link's width and "
                       "speed (ibstat, nvidia-smi topo -m)"))
    return out


def _host(ranks: list[dict], rank: int) -> str:
    return next((f["host"] for f in ranks if f["rank"] == rank), "?")


def _size(n: float | None) -> str:
    if n is None:
        return "?"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return "?"
