"""Why a straggler is late: its steps against the other ranks' (steptime.py).

All ranks leave a collective together, so every rank's step lasts as long; what differs is
how it is spent. The late rank spends the extra somewhere outside collectives (the others
spend it waiting inside them):
- input: it waits longer for its batches (the implicit "data" spans);
- cpu: its main thread waited for a CPU (run queue delay, in the samples) that much
  longer than the others': not more work, but a node with more runnable threads than
  cores (another job, DataLoader workers, OMP threads), or a rank squeezed onto fewer
  cores;
- compute: the rest of its step (forward, backward, its own work) is longer; the sampled
  user lines it spends the extra at name the function;
- link: the rank's collectives in one group take far longer than the same kind of group's
  elsewhere (its TP pair against the other TP pairs: a slow link is waited on inside the
  collective, by all its members, who then arrive late everywhere else); or, failing
  that comparison, its lateness sits in one of its groups only;
- unknown: none of these (a busy host, a throttled GPU: see the throttle join).
"""

from __future__ import annotations

import statistics

SHARE = 0.5  # a category explains the lateness when it holds at least this share of it
GROUP_SHARE = 0.8  # lateness "in one group only"
TOP_FRAMES = 3
CPU_OVER_WORK = 2.0  # cause "cpu": the extra CPU wait this many times the extra work on it

REMEDY = {
    "input": "The rank waits for its data: look at its DataLoader (num_workers, pin_memory, "
             "prefetch_factor), its dataset's __getitem__ (decoding, a slow file system, "
             "uneven shard sizes).",
    "cpu": "The rank waits for a CPU: its node runs more threads than it has cores. Look "
           "for other processes on the node (`top`), DataLoader workers and OMP/MKL threads "
           "per rank (OMP_NUM_THREADS), and the rank's CPU affinity (taskset -p PID); give "
           "each rank its own cores (torchrun --numa-binding, or taskset).",
    "compute": "The rank does more work per step than the others, at the lines named: "
               "rank-specific work (logging, metrics, checkpointing on one rank), uneven "
               "batches or sequence lengths, a slower or throttled device.",
    "link": "The rank is late in one group only: check the link to that group's peers "
            "(NCCL_DEBUG=INFO transport lines, `distdoctor nccl-test --pairwise`).",
    "unknown": "Look at what the rank does before these collectives: uneven data or work, "
               "a slow or throttled GPU (see throttle findings), a busy host (CPU, I/O), or "
               "rank-0-only work such as logging or checkpointing.",
}


def _where(site) -> str:
    function, file, line = site
    short = file.rsplit("/", 1)[-1] if file else "?"
    return f"{function} ({short}:{line})"


def explain(rank: int, lateness_ms: float, keys, time: dict, other_keys: dict,
            group_shares: dict, groups: set) -> dict:
    """{cause, text, breakdown (per rank), frames, callsites} for rank `rank`, late by
    `lateness_ms` per step over its steps `keys`; the others over their own latest as many
    steps (`other_keys`)."""
    mine = time[rank].breakdown(keys) if rank in time else None
    others = {r: time[r].breakdown(k) for r, k in other_keys.items() if r in time}
    others = {r: b for r, b in others.items() if b is not None}
    out = {"cause": "unknown", "text": "", "breakdown": {}, "frames": [], "callsites": []}
    if mine is not None:
        out["breakdown"][str(rank)] = _rounded(mine)
    for r, b in sorted(others.items()):
        out["breakdown"][str(r)] = _rounded(b)
    if mine is None or not others:
        return _by_group(out, group_shares, groups)

    def typical(name):
        return statistics.median(b[name] for b in others.values())

    data_extra = mine["data_ms"] - typical("data_ms")
    compute_extra = mine["compute_ms"] - typical("compute_ms")
    cpu_extra = mine["runq_ms"] - typical("runq_ms")
    frames = _frames(time[rank], mine, others, lateness_ms)
    out["frames"] = frames
    out["callsites"] = [{"rank": rank, "file": f["file"], "line": f["line"],
                         "function": f["function"], "source": "sample"} for f in frames[:1]]
    at = f", in {frames[0]['where']}" if frames else ""
    # work at lines of its own, which its peers barely run (a log call, an extra pass):
    # the program's, whatever the machine's load. On a busy node such a rank also waits
    # longer for a CPU (it is runnable longer; 5 runnable threads a core make 30 ms of
    # extra work 150 ms), which must not turn the program's cause into the machine's
    own_ms = _own_lines_ms(frames)
    own_work = (compute_extra >= SHARE / 2 * lateness_ms and own_ms >= SHARE * lateness_ms)
    if own_work:
        out["own_work_ms_per_step"] = own_ms
    if data_extra >= SHARE * lateness_ms and data_extra >= compute_extra:
        batches = max(mine["batches"], 1.0)
        others_batches = max(typical("batches"), 1.0)
        out["cause"] = "input"
        out["text"] = (f"its DataLoader takes {mine['data_ms'] / batches:.1f} ms per batch "
                       f"(the others {typical('data_ms') / others_batches:.1f} ms){at}")
    elif not own_work and cpu_extra >= SHARE * lateness_ms and cpu_extra >= CPU_OVER_WORK * (
            compute_extra - cpu_extra):
        # the wait for a CPU, not more work: a rank that works more on a busy node also
        # waits more (it is runnable longer); its work beyond that wait must stay small
        out["cause"] = "cpu"
        out["text"] = (f"it waited {mine['runq_ms']:.1f} ms per step for a CPU (the others "
                       f"{typical('runq_ms'):.1f} ms){at}: its node is oversubscribed")
    elif own_work or compute_extra >= SHARE * lateness_ms or (
            compute_extra >= SHARE / 2 * lateness_ms
            and _sampled_extra(frames) >= SHARE * lateness_ms):
        # its own work is longer: by the breakdown, or by the samples at its own lines where
        # the breakdown agrees in part (the sampler's clock is the wall's: on a loaded
        # machine the peers' compute carries their waits for a CPU, which thin the
        # breakdown's difference)
        out["cause"] = "compute"
        out["text"] = (f"its own work between collectives takes {compute_extra:.1f} ms more "
                       f"per step than the others' ({mine['compute_ms']:.1f} against "
                       f"{typical('compute_ms'):.1f} ms){at}")
    elif not _slow_sibling_group(out, rank, lateness_ms, mine, others, time):
        _by_group(out, group_shares, groups)
        if out["cause"] == "unknown" and frames:
            out["text"] = f"its extra time between collectives goes to {frames[0]['where']}"
    return out


SLOW_GROUP_RATIO = 2.0  # a group's collectives this much slower than its siblings'


def _slow_sibling_group(out, rank, lateness_ms, mine, others, time) -> bool:
    """Its time inside one group's collectives against the other ranks' time inside
    groups of the same description (DeviceMesh dimension) that are not that group."""
    descs = time[rank].group_desc
    for group, ms in sorted(mine["group_ms"].items(), key=lambda kv: -kv[1]):
        desc = descs.get(group)
        if not desc:
            continue
        sibling = [b["group_ms"][g] for r, b in others.items() for g in b["group_ms"]
                   if g != group and time[r].group_desc.get(g) == desc]
        if not sibling:
            continue
        typical = statistics.median(sibling)
        if ms - typical >= SHARE * lateness_ms and ms >= SLOW_GROUP_RATIO * typical:
            out["cause"] = "link"
            out["text"] = (f"its collectives in group {group} ({desc}) take {ms:.1f} ms per "
                           f"step against {typical:.1f} ms in the other {desc} groups: that "
                           f"group's link")
            out["slow_group"] = group
            return True
    return False


def _sampled_extra(frames: list[dict]) -> float:
    return sum(f["extra_ms_per_step"] for f in frames)


OWN_LINE_PEERS = 0.2  # a line of its own: its peers spend at most this share of its extra
MIN_OWN_SAMPLES = 12  # more samples than its peers' at a line of its own, over the window


def _own_lines_ms(frames: list[dict]) -> float:
    """The extra ms per step at lines its peers barely run (a line every rank runs,
    slower on a starved rank, is not one: the peers spend time there too)."""
    return sum(f["extra_ms_per_step"] for f in frames
               if f["peers_ms_per_step"] <= OWN_LINE_PEERS * f["extra_ms_per_step"])


def _by_group(out: dict, group_shares: dict, groups: set) -> dict:
    if len(groups) >= 2 and group_shares:
        group, share = max(group_shares.items(), key=lambda kv: kv[1])
        if share >= GROUP_SHARE:
            out["cause"] = "link"
            out["text"] = (f"late in group {group} only ({share:.0%} of its late "
                           f"collectives): that group's link")
    return out


def _frames(steps, mine: dict, others: dict, lateness_ms: float) -> list[dict]:
    """The user lines where the rank spends more samples per step than the others: half
    a sample a step more; or, at a line its peers barely run, MIN_OWN_SAMPLES more over
    the window that make a quarter of its lateness (a sampler starved on a loaded node
    takes fewer looks, and a line no peer runs is the program's, whatever the load)."""
    if not mine["samples"]:
        return []
    period = steps.sample_period_ms or 20.0
    per_step = {site: n / mine["steps"] for site, n in mine["samples"].items()}
    typical = {}
    for site in per_step:
        typical[site] = statistics.median(
            b["samples"].get(site, 0) / b["steps"] for b in others.values())
    extra = sorted(((per_step[s] - typical[s], s) for s in per_step), reverse=True)
    total = sum(per_step.values())
    out = []
    for gain, site in extra[:TOP_FRAMES]:
        own = (typical[site] <= OWN_LINE_PEERS * gain and gain * mine["steps"] >= MIN_OWN_SAMPLES
               and gain * period >= SHARE / 2 * lateness_ms)
        if gain <= 0.5 and not own:  # under half a sample per step: noise
            continue
        function, file, line = site
        out.append({"function": function, "file": file, "line": line,
                    "where": _where(site), "extra_ms_per_step": round(gain * period, 1),
                    "peers_ms_per_step": round(typical[site] * period, 1),
                    "share": round(per_step[site] / total, 3) if total else 0.0})
    return out


def _rounded(b: dict) -> dict:
    return {k: round(v, 2) for k, v in b.items() if k not in ("samples", "group_ms")}
