"""The machine's noise said as the machine's: a rank late because its cores are busy.

A rank whose lateness is mostly time its threads spent waiting for a CPU (run queue delay)
is not slow by its program: its node runs more than its cores hold (another job, a
daemon, a neighbour VM's steal). That is a `host` finding naming the node and the busy
processes there (DESIGN: "a machine's own noise is a host finding, never a program's
straggler"), not a straggler blamed on the program.

Two readings say it, either one enough:
- the rank's own main thread (the tracer's samples: its run queue delay per step, cause
  "cpu" in cause.py);
- the node sampler (probes/host.py): the run queue delay of all the rank process's threads
  (gloo's workers run its collectives), against the other ranks' on that node, with the
  other processes' CPU on the ranks' cores and the steal time.

On a node where other processes are busy, a rank late by its own work at no line of its
code (every line a little slower, no wait to show for it) is the node's too (`_nowhere`).
Lateness that the busy cores explain only in part stays a straggler, with the busy
processes noted. Pure functions over findings and probe samples (duck-typed: the
diagnosis never imports the probes).
"""

from __future__ import annotations

import statistics

from distdoctor.diagnosis.stragglers.cause import CPU_OVER_WORK
from distdoctor.findings import Finding

RECENT_SAMPLES = 30  # node samples (1 Hz) looked at: the recent steps' time
SHARE = 0.5  # the CPU wait must hold this share of the lateness
MAIN_SHARE = 0.25  # ... and the main thread's own wait at least this share
BUSY_PCT = 20.0  # the other processes together make the node busy from this share of a core
NAMED_PCT = 5.0  # a program (all its processes) named among them from this share
TOP = 5  # busy processes named
NODE_SPAN_S = 3.0  # the node sampler's reading judges steps that span this long at least
STEAL_PCT = 5.0  # steal time that counts as the hypervisor's load

REMEDY = ("The rank waits for a CPU, not for its own work: other processes use its cores. "
          "Move them off the node or off the ranks' cores (taskset, cgroups cpusets, "
          "isolcpus), give each rank its own cores (torchrun --numa-binding, taskset), and "
          "keep DataLoader workers and OMP/MKL threads within the rank's share. On a VM, "
          "steal time means the hypervisor gives the cores to another guest.")


def node_view(samples, rank: int) -> dict | None:
    """What the recent samples of the node running `rank` say: {host, busy (a pid of it ->
    a program: {name, pid, pids, count, cpu_pct}), busy_cores (all other processes' CPU, in
    cores), steal_pct, runq_ms_per_s (rank -> its process' CPU wait per second)}; None
    when no sample covers the rank."""
    mine = [s for s in list(samples)[-4 * RECENT_SAMPLES:]
            if any(getattr(p, "rank", None) == rank for p in getattr(s, "processes", ()))]
    mine = mine[-RECENT_SAMPLES:]
    if not mine:
        return None
    host = mine[-1].host
    busy: dict[int, dict] = {}
    steal, runq, others = [], {}, []
    for s in mine:
        hs = s.host_stats
        if hs is None:
            continue
        if getattr(hs, "steal_pct", None) is not None:
            steal.append(hs.steal_pct)
        if getattr(hs, "others_pct", None) is not None:
            others.append(hs.others_pct)
        for b in getattr(hs, "busy", None) or ():
            # one program across samples: the entries that share a process (its busiest
            # may change between samples); run dirs written before the probe grouped
            # processes hold one each
            pids = set(b.get("pids") or [b["pid"]])
            d = next((d for d in busy.values() if pids & set(d["pids"])), None)
            if d is None:
                d = busy[b["pid"]] = {"name": b.get("name"), "pid": b["pid"], "pids": [],
                                      "count": 0, "cpu_pct": 0.0, "cpus": b.get("cpus")}
            d["cpu_pct"] += b.get("cpu_pct") or 0.0
            d["pids"] = sorted({*d["pids"], *pids})
            d["count"] = max(d["count"], b.get("count") or 1, len(d["pids"]))
        for p in s.processes:
            q = getattr(p, "runq_ms_per_s", None)
            if q is not None:
                runq.setdefault(p.rank, []).append(q)
    n = len(mine)
    for d in busy.values():
        d["cpu_pct"] = round(d["cpu_pct"] / n, 1)
    # all other processes' CPU, small ones too (a hundred workers at 5% each are 5 cores)
    total = sum(others) / n if others else sum(d["cpu_pct"] for d in busy.values())
    busy = {k: d for k, d in busy.items() if d["cpu_pct"] >= NAMED_PCT}
    return {"host": host, "busy": busy, "busy_cores": round(total / 100, 2),
            "steal_pct": round(statistics.mean(steal), 1) if steal else None,
            "runq_ms_per_s": {r: statistics.mean(v) for r, v in runq.items()}}


def _cpu_wait(f: Finding, node: dict | None, time: dict) -> tuple[float, float] | None:
    """(the rank's CPU wait per step, the other ranks' typical) from the node sampler's
    whole-process reading, scaled by the rank's step time; None without it, or when the
    steps the rank is late in last less than a few of its 1 Hz samples (the reading
    covers the last 30 s: it would speak of other steps than the late ones)."""
    if node is None:
        return None
    rank = f.ranks[0]
    runq = node["runq_ms_per_s"]
    if rank not in runq or len(runq) < 2:
        return None
    steps = time.get(rank)
    recent = steps.recent() if steps is not None else None
    if not recent or not recent.get("wall_ms"):
        return None
    per_step = recent["wall_ms"] / 1000
    if (f.details.get("steps") or 0) * per_step < NODE_SPAN_S:
        return None  # steps too short a time for the 1 Hz sampler to see them
    others = [v for r, v in runq.items() if r != rank]
    return runq[rank] * per_step, statistics.median(others) * per_step


def separate(stragglers: list[Finding], samples, time: dict) -> list[Finding]:
    """The straggler findings whose lateness the busy host explains become one host
    finding per node; the others stay (with the node's busy processes noted)."""
    out: list[Finding] = []
    by_host: dict[str, list] = {}
    for f in stragglers:
        rank = f.ranks[0]
        node = node_view(samples, rank) if samples else None
        lateness = f.details.get("step_lateness_ms") or 0.0
        wait = _cpu_wait(f, node, time)
        said = f.details.get("cause") == "cpu"
        extra = 0.0 if wait is None else wait[0] - wait[1]
        # a rank that works more is runnable longer and waits more on a busy node: the
        # wait must outweigh its extra work (cause.CPU_OVER_WORK, as for its main thread)
        # ... and its main thread waited for a CPU too (a rank that sleeps or blocks in
        # its own code is late with no wait of its own, whatever its threads' share)
        measured = (extra >= SHARE * lateness
                    and extra >= CPU_OVER_WORK * (_compute_extra(f) - extra)
                    and _extra(f, "runq_ms") >= MAIN_SHARE * lateness)
        # busy cores: other processes' or the hypervisor's, where the sampler saw the node
        # (a node that only the job's own threads oversubscribe stays the program's)
        busy = node is not None and (node["busy_cores"] * 100 >= BUSY_PCT
                                     or (node["steal_pct"] or 0) >= STEAL_PCT)
        # Either reading is enough: its main thread's over the late steps themselves, or
        # all its threads' from the node sampler. The latter is a 30 s average of the
        # whole process (gloo's and distdoctor's threads too), and missed what the former
        # saw: a rank whose main thread waited 10 ms more per step for a CPU than its
        # peer's, 28.2 against 16.9 ms (cause cpu), stayed a straggler of the program on
        # healthy nanoGPT beside other jobs, as both processes waited ~950 ms a second.
        # program before machine: work at lines of its own (cause.py) stays the
        # program's straggler, the busy processes noted
        own = bool(f.details.get("own_work_ms_per_step"))
        if (said or measured) and (node is None or busy) and not own:
            by_host.setdefault(node["host"] if node else "", []).append((f, node, wait, False))
            continue
        if busy and _nowhere(f):
            by_host.setdefault(node["host"], []).append((f, node, None, True))
            continue
        if node and node["busy"]:
            f.details["busy_processes"] = _busy_list(node)
        out.append(f)
    for host, items in by_host.items():
        out.append(_host_finding(host, items))
    return out


def _nowhere(f: Finding) -> bool:
    """Its extra time is its own work (or unknown), at no line of its code that it runs
    at least twice as long as its peers (cause.py's frames): every line a little slower.
    A rank that the program makes late does work its peers do not, or far more of it (a
    log call, an extra forward, a slow augmentation: the straggler tests each name such a
    line); on a node where other processes are busy, one whose lines all run somewhat
    longer is slowed by the node (a neighbour on its core or its sibling, its cache, its
    memory bandwidth), with no wait of its own to show for it. Seen on healthy nanoGPT
    beside other jobs: a rank "compute" late 8-17 ms per step in 6 runs of 6, at no line
    or at the backward pass that both ranks run (15.5 ms more there), no more CPU wait
    than its peer. An uneven batch on a busy node is said as the node's too: the price of
    not blaming the program for its neighbours."""
    if f.details.get("cause") not in ("compute", "unknown"):
        return False
    return not [fr for fr in f.details.get("top_frames") or ()
                if fr["extra_ms_per_step"] >= fr.get("peers_ms_per_step", 0.0)]


def _extra(f: Finding, name: str) -> float:
    """The rank's `name` ms per step beyond its peers' (the finding's breakdown)."""
    b = f.details.get("breakdown") or {}
    mine = b.get(str(f.ranks[0]), {}).get(name)
    others = [v.get(name) for k, v in b.items() if k != str(f.ranks[0])
              and v.get(name) is not None]
    if mine is None or not others:
        return 0.0
    return mine - statistics.median(others)


def _compute_extra(f: Finding) -> float:
    return _extra(f, "compute_ms")


def _busy_list(node: dict) -> list[dict]:
    return sorted(node["busy"].values(), key=lambda d: -d["cpu_pct"])[:TOP]


def _program_text(b: dict) -> str:
    name = b["name"] or "?"
    if b.get("count", 1) > 1:
        return f"{name} x{b['count']} (pids {', '.join(map(str, b['pids'][:4]))}" \
            f"{', ...' if b['count'] > 4 else ''}; {b['cpu_pct']:.0f}% of a core)"
    return f"{name} (pid {b['pid']}, {b['cpu_pct']:.0f}% of a core)"


def _host_finding(host: str, items: list) -> Finding:
    ranks = sorted(f.ranks[0] for f, *_ in items)
    node = next((n for _, n, *_ in items if n is not None), None)
    where = f"node {host}" if host else f"the node of rank{'s' if len(ranks) > 1 else ''} " \
        + ", ".join(map(str, ranks))
    waits = []
    for f, _, wait, slower in items:
        r = f.ranks[0]
        b = f.details.get("breakdown", {})
        late = f"kept the others waiting {f.details.get('step_lateness_ms', 0.0):.1f} ms per step"
        if slower:  # _nowhere: no wait, no line
            waits.append(f"rank {r} {late}, its work slower at every line (at none more than "
                         f"its peers'), with no wait of its own to show for it")
            continue
        mine, others = (wait if wait is not None else
                        (b.get(str(r), {}).get("runq_ms", 0.0),
                         statistics.median([v.get("runq_ms", 0.0) for k, v in b.items()
                                            if k != str(r)] or [0.0])))
        waits.append(f"rank {r} waited {mine:.1f} ms per step for a CPU (the others "
                     f"{others:.1f} ms) and {late}")
    busy = _busy_list(node) if node else []
    what = ""
    if busy:
        what = "; busy there: " + ", ".join(map(_program_text, busy))
        if node["busy_cores"] * 100 > 1.5 * sum(b["cpu_pct"] for b in busy):
            what += f" (other processes: {node['busy_cores']:.1f} cores in all)"
    steal = node.get("steal_pct") if node else None
    if steal:
        what += f"; steal time {steal:.0f}%"
    summary = (f"host: {where} is busy — " + "; ".join(waits) + what
               + ": the machine's load, not the program")
    details = {"host": host or None, "slowed_ranks": ranks, "busy_processes": busy,
               "busy_cores": node["busy_cores"] if node else None, "steal_pct": steal,
               "lateness_ms_per_step": {str(f.ranks[0]): f.details.get("step_lateness_ms")
                                        for f, *_ in items},
               "as_straggler": {str(f.ranks[0]): f.summary for f, *_ in items},
               "slower_without_wait": [f.ranks[0] for f, *_, slower in items if slower]}
    return Finding("host", "warning", summary, [], items[0][0].group, None,
                   [c for f, *_ in items for c in f.callsites[:1]], details=details,
                   remedy=REMEDY)
