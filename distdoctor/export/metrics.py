"""Prometheus metrics of a live job: `distdoctor run --metrics` (a node's ranks) and
`distdoctor watch --listen ... --metrics` (the collector: every rank).

Metric names are a contract (DESIGN.md), listed in METRICS and in docs/metrics.md. Values are
read from the live engine at scrape time, under its lock, as plain numbers (the view in
views/rank_metrics.py; this module names and renders them): nothing is kept between scrapes, so a job's series are as many as its ranks and (group, op) pairs
(`series_count` says how many), never one per collective.

GPU readings go out under dcgm-exporter's own names and labels (`gpu`, `UUID`, `device`,
`modelName`, `Hostname`) with `rank` added, so dashboards built for dcgm-exporter work on
them and can join a GPU to its rank. A replayed NVML reading (tests, a recorded fixture)
carries `source="replay"`, never passed off as live (DESIGN principle 4).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from distdoctor.views.probe_columns import gpu_key
from distdoctor.views.rank import RankMetrics, is_value
from distdoctor.views.rank_metrics import job_metrics

RANK_STATES = ("starting", "running", "in_collective", "long_wait", "hung", "no_heartbeat",
               "exited", "failed")
MAX_CULPRITS = 64  # per finding: a hang of 4,096 ranks names its few culprits, not all

# name, type, help (docs/metrics.md lists this table)
METRICS = (
    ("distdoctor_collectives_total", "counter",
     "Collectives and p2p ops completed, per rank, group and op"),
    ("distdoctor_collective_seconds_total", "counter",
     "Seconds spent inside completed collectives (the rank's own wait included)"),
    ("distdoctor_rank_state", "gauge",
     "1 for the rank's current state, 0 for the others: " + ", ".join(RANK_STATES)),
    ("distdoctor_rank_in_collective_seconds", "gauge",
     "How long the rank's current collective has been in flight (0 outside one)"),
    ("distdoctor_rank_heartbeat_age_seconds", "gauge",
     "Seconds since the rank's newest heartbeat (written every second while it lives)"),
    ("distdoctor_step", "gauge", "Steps the rank has finished, as the engine saw them"),
    ("distdoctor_step_seconds", "gauge", "Mean wall time of the rank's last 10 steps"),
    ("distdoctor_straggler_lateness_seconds", "gauge",
     "How long the rank keeps the others waiting per step (mean of its recent steps)"),
    ("distdoctor_findings", "gauge", "Current findings, per kind and severity"),
    ("distdoctor_culprit", "gauge", "1 for each rank a current finding names as a culprit"),
    ("distdoctor_events_ingested_total", "counter", "Events the live engine has read"),
)

# dcgm-exporter's field names, with the reading each comes from and its scale
DCGM_FIELDS = (
    ("DCGM_FI_DEV_GPU_TEMP", "temperature_c", 1, "GPU temperature (in C)."),
    ("DCGM_FI_DEV_SM_CLOCK", "sm_clock_mhz", 1, "SM clock frequency (in MHz)."),
    ("DCGM_FI_DEV_POWER_USAGE", "power_w", 1, "Power draw (in W)."),
    ("DCGM_FI_DEV_POWER_MGMT_LIMIT", "power_limit_w", 1, "Power management limit (in W)."),
    ("DCGM_FI_DEV_GPU_UTIL", "utilization_pct", 1, "GPU utilization (in %)."),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "memory_utilization_pct", 1, "Memory utilization (in %)."),
    ("DCGM_FI_DEV_FB_USED", "memory_used_bytes", 1 / 2**20, "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "reasons_mask", 1,
     "Current clock event reasons (bitmask of NVML's nvmlClocksEventReason*)."),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "energy_mj", 1,
     "Total energy consumption since boot (in mJ)."),
    ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "ecc_corrected", 1,
     "Total number of single-bit volatile ECC errors."),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "ecc_uncorrected", 1,
     "Total number of double-bit volatile ECC errors."),
)


def job_label(run_dir) -> str:
    """The `job` label: the scheduler's id for the job where there is one, so the series
    of every node (and of the collector) share it; else the run dir's name."""
    for var in ("SLURM_JOB_ID", "TORCHELASTIC_RUN_ID"):
        value = os.environ.get(var)
        if value and value != "none":
            return value
    return os.path.basename(os.path.normpath(str(run_dir)))


@dataclass
class _Family:
    name: str
    kind: str
    help: str
    samples: list  # (labels dict, value)


def gather(live, job: str, now_s: float | None = None, fleet=None) -> list[_Family]:
    """Every metric of the job as it stands (views/rank_metrics.py reads it under the live
    engine's lock); `fleet`: the collector's engine, for the ranks whose nodes send
    digests."""
    now_s = time.monotonic() if now_s is None else now_s
    fam = {name: _Family(name, kind, text, []) for name, kind, text in METRICS}
    job_now = job_metrics(live, now_s, fleet)
    for local_rank, m in job_now.ranks:
        _rank_samples(fam, job, local_rank, m)
    counts: dict[tuple[str, str], int] = {}
    culprits: dict[tuple[str, int], None] = {}  # two findings may blame one rank
    for f in job_now.findings:
        counts[(f.kind, f.severity)] = counts.get((f.kind, f.severity), 0) + 1
        culprits.update(((f.kind, r), None) for r in f.ranks[:MAX_CULPRITS])
    fam["distdoctor_culprit"].samples = [
        ({"job": job, "kind": kind, "rank": str(r)}, 1.0) for kind, r in culprits]
    for (kind, severity), n in sorted(counts.items()):
        fam["distdoctor_findings"].samples.append(
            ({"job": job, "kind": kind, "severity": severity}, n))
    fam["distdoctor_events_ingested_total"].samples.append(({"job": job}, job_now.ingested))
    return list(fam.values()) + _gpu_families(job_now.samples, job)


def _rank_samples(fam: dict, job: str, local_rank, m: RankMetrics) -> None:
    """One rank's series."""
    base = {"job": job, "rank": str(m.rank), "local_rank": _text(local_rank), "host": m.host}
    state = m.state.replace(" ", "_")
    for s in RANK_STATES:
        fam["distdoctor_rank_state"].samples.append(
            ({**base, "state": s}, 1.0 if s == state else 0.0))
    fam["distdoctor_rank_in_collective_seconds"].samples.append((base, m.in_collective_s))
    if m.heartbeat_age_s is not None:
        fam["distdoctor_rank_heartbeat_age_seconds"].samples.append(
            (base, max(0.0, m.heartbeat_age_s)))
    for group, desc, op, count, seconds in m.done:
        labels = {**base, "group": group, "group_desc": desc, "op": op}
        fam["distdoctor_collectives_total"].samples.append((labels, count))
        fam["distdoctor_collective_seconds_total"].samples.append((labels, seconds))
    if m.steps:
        fam["distdoctor_step"].samples.append((base, m.steps))
        if m.step_s is not None:
            fam["distdoctor_step_seconds"].samples.append((base, m.step_s))
    if m.late_s is not None:
        fam["distdoctor_straggler_lateness_seconds"].samples.append((base, m.late_s))


def _gpu_families(samples: list, job: str) -> list[_Family]:
    """The newest probe sample of each host, as dcgm-exporter would export its GPUs."""
    newest = {}
    for s in samples:  # oldest first
        if getattr(s, "gpus", ()):
            newest[s.host] = s
    fams = [_Family(name, "gauge", text, []) for name, _, _, text in DCGM_FIELDS]
    for host, s in sorted(newest.items()):
        ranks_of: dict[str, list[int]] = {}
        for r, key in s.gpu_of_rank.items():
            ranks_of.setdefault(key, []).append(r)
        for g in s.gpus:
            labels = {"job": job, "gpu": str(g.index), "UUID": _text(g.uuid),
                      "device": f"nvidia{g.index}", "modelName": _text(g.name),
                      "Hostname": host, "pci_bus_id": _text(g.pci_bus_id),
                      "source": "live" if str(g.source).startswith("live") else "replay"}
            ranks = sorted(ranks_of.get(gpu_key(g), ())) or [None]
            for r in ranks:  # one series per rank on the GPU (two ranks may share one)
                rl = {**labels, "rank": _text(r)}
                for fam, (_, attr, scale, _) in zip(fams, DCGM_FIELDS, strict=True):
                    value = getattr(g, attr, None)
                    if is_value(value):  # (a probe file's number no float holds: left out)
                        fam.samples.append((rl, value * scale))
    return fams


def _text(value) -> str:
    return "" if value is None else str(value)


# --- the text exposition format -----------------------------------------------------------
def render(families: list[_Family]) -> bytes:
    """Prometheus text format 0.0.4, as `prometheus_client.generate_latest` writes it."""
    from prometheus_client import generate_latest
    from prometheus_client.core import CollectorRegistry, Metric

    class _Once:
        def collect(self):
            for f in families:
                name = f.name[:-len("_total")] if f.kind == "counter" else f.name
                m = Metric(name, f.help, f.kind)
                for labels, value in f.samples:
                    m.add_sample(f.name, labels, float(value))
                yield m

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Once())
    return generate_latest(registry)


def series_count(families: list[_Family]) -> int:
    return sum(len(f.samples) for f in families)
