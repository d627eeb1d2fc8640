"""The throttle detector: a busy GPU slowed down by heat, power or hardware, and its rank.

A reading is throttled when the GPU reports a slowdown reason (SW/HW thermal, SW power cap,
HW slowdown, HW power brake, board limit, reliability: not GPU idle, application clocks,
display clocks or sync boost) while it is busy (utilization at least `min_utilization_pct`)
and its SM clock is well below its maximum (at most `max_clock_ratio` of it). Consecutive
throttled readings of one GPU form an episode; an episode lasting `min_duration_s` or more is a
finding that names the rank the GPU serves, the temperature, the clocks, the reasons and how
long. `join_with_straggler` merges it with the straggler finding for the same rank into one.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence

from distdoctor.findings import Finding
from distdoctor.probes.nvml_values import REASON_LABELS, SLOWDOWN_REASONS, GpuSnapshot
from distdoctor.probes.sampler import NodeSample, gpu_key

# most specific first: the headline names the first present
_HEADLINE_ORDER = ("hw_thermal_slowdown", "hw_power_brake_slowdown", "sw_thermal_slowdown",
                   "hw_slowdown", "sw_power_cap", "board_limit", "reliability")
_SEVERITY = {"error": 2, "warning": 1, "info": 0}


def _throttled(g: GpuSnapshot, min_util: float, max_ratio: float) -> bool:
    ratio = g.clock_ratio
    return (bool(SLOWDOWN_REASONS.intersection(g.reasons)) and g.utilization_pct is not None
            and g.utilization_pct >= min_util and ratio is not None and ratio <= max_ratio)


def headline_reasons(reasons: Iterable[str]) -> list[str]:
    """Slowdown reasons, most specific first; "HW slowdown" is dropped when a specific HW
    reason (thermal, power brake) explains it."""
    present = [r for r in _HEADLINE_ORDER if r in set(reasons)]
    if "hw_slowdown" in present and {"hw_thermal_slowdown",
                                     "hw_power_brake_slowdown"} & set(present):
        present.remove("hw_slowdown")
    return present


def _remedy(reasons: list[str], g: GpuSnapshot) -> str:
    if any("thermal" in r for r in reasons):
        return (f"GPU {g.index} is too hot: check the node's cooling (fans, airflow, inlet "
                "temperature) and compare with `nvidia-smi -q -d TEMPERATURE,PERFORMANCE`; "
                "drain the node if it persists.")
    if "hw_power_brake_slowdown" in reasons:
        return ("The board's power-brake signal is asserted: have the node's power supply and "
                "power delivery checked.")
    if "sw_power_cap" in reasons or "board_limit" in reasons:
        return (f"GPU {g.index} runs at its power limit ({g.power_limit_w} W): look for a "
                "lowered limit (`nvidia-smi -q -d POWER`, `nvidia-smi -pl`) and compare with the "
                "other GPUs.")
    return "Check `nvidia-smi -q -d PERFORMANCE` for the slowdown reason and the node's health."


def _ranks_by_gpu(samples: Sequence[NodeSample]) -> dict[tuple[str, str], list[int]]:
    out: dict[tuple[str, str], list[int]] = {}
    for s in samples:
        if not s.gpu_of_rank:
            continue
        by_gpu: dict[str, list[int]] = {}
        for rank, key in s.gpu_of_rank.items():
            by_gpu.setdefault(key, []).append(rank)
        for key, ranks in by_gpu.items():
            out[(s.host, key)] = sorted(ranks)  # the latest mapping wins
    return out


def _episodes(readings: list[GpuSnapshot], min_util: float, max_ratio: float,
              max_gap_s: float) -> list[list[GpuSnapshot]]:
    episodes: list[list[GpuSnapshot]] = []
    current: list[GpuSnapshot] = []
    for g in readings:
        if _throttled(g, min_util, max_ratio) and (not current or g.t - current[-1].t <= max_gap_s):
            current.append(g)
            continue
        if current:
            episodes.append(current)
        current = [g] if _throttled(g, min_util, max_ratio) else []
    if current:
        episodes.append(current)
    return episodes


def throttle_findings(samples: Sequence[NodeSample | dict],
                      rank_of_gpu: Mapping[str, int | Sequence[int]] | None = None, *,
                      min_utilization_pct: float = 60.0, max_clock_ratio: float = 0.9,
                      min_duration_s: float = 3.0, max_gap_s: float = 5.0) -> list[Finding]:
    """One finding per GPU whose latest long-enough throttle episode passes the thresholds.

    `samples`: the sampler's NodeSamples (or their JSON). `rank_of_gpu`: GPU UUID -> rank(s);
    by default the mapping the sampler recorded.
    """
    samples = [s if isinstance(s, NodeSample) else NodeSample.from_json(s) for s in samples]
    ranks_of = _ranks_by_gpu(samples)
    series: dict[tuple[str, str], list[GpuSnapshot]] = {}
    for s in samples:
        for g in s.gpus:
            series.setdefault((s.host, gpu_key(g)), []).append(g)
    out = []
    for (host, key), readings in series.items():
        readings.sort(key=lambda g: g.t)
        gaps = [b.t - a.t for a, b in zip(readings, readings[1:], strict=False) if b.t > a.t]
        spacing = statistics.median(gaps) if gaps else 1.0
        for ep in reversed(_episodes(readings, min_utilization_pct, max_clock_ratio, max_gap_s)):
            duration = ep[-1].t - ep[0].t + spacing
            if duration >= min_duration_s:
                if rank_of_gpu is not None:
                    r = rank_of_gpu.get(key)
                    ranks = [] if r is None else ([r] if isinstance(r, int) else sorted(r))
                else:
                    ranks = ranks_of.get((host, key), [])
                out.append(_finding(host, ep, duration, ranks))
                break
    out.sort(key=lambda f: (f.ranks or [1 << 30], f.details.get("gpu_index", 0)))
    return out


def _finding(host: str, ep: list[GpuSnapshot], duration: float, ranks: list[int]) -> Finding:
    worst = min(reversed(ep), key=lambda g: g.clock_ratio or 1.0)
    seen = sorted({r for g in ep for r in g.reasons})
    reasons = headline_reasons(seen)
    what = " and ".join(REASON_LABELS[r] for r in reasons)
    who = (f"rank {ranks[0]}'s GPU" if len(ranks) == 1 else
           f"ranks {', '.join(map(str, ranks))}' GPU" if ranks else "GPU")
    replay = replay_note(worst.source)
    summary = (f"throttle: {who} {worst.index} on {host} reports {what} at "
               f"{worst.temperature_c} C, SM clock {worst.sm_clock_mhz}/"
               f"{worst.max_sm_clock_mhz} MHz at {worst.utilization_pct}% load, for "
               f"{duration:.0f} s{replay}")
    violation = {}
    for policy, end in ep[-1].violation_ns.items():
        start = ep[0].violation_ns.get(policy)
        if start is not None and end > start:
            violation[policy] = round((end - start) / 1e9, 3)
    details = {"host": host, "gpu_index": worst.index, "gpu_uuid": worst.uuid,
               "gpu_name": worst.name, "pci_bus_id": worst.pci_bus_id,
               "temperature_c": worst.temperature_c, "slowdown_c": worst.slowdown_c,
               "shutdown_c": worst.shutdown_c, "sm_clock_mhz": worst.sm_clock_mhz,
               "max_sm_clock_mhz": worst.max_sm_clock_mhz,
               "clock_ratio": round(worst.clock_ratio or 0.0, 3),
               "utilization_pct": worst.utilization_pct, "power_w": worst.power_w,
               "power_limit_w": worst.power_limit_w, "reasons": seen,
               "headline_reasons": reasons, "duration_s": round(duration, 1),
               "first_t": ep[0].t, "last_t": ep[-1].t, "readings": len(ep),
               "violation_s": violation, "source": worst.source}
    return Finding("throttle", "warning", summary, ranks, details=details,
                   remedy=_remedy(reasons, worst))


def replay_note(source: str) -> str:
    """Nothing for live readings; a marker for replayed ones (never shown as live)."""
    if source == "live":
        return ""
    return f" [replayed NVML readings: {source.removeprefix('replay:')}]"


def _ms(x: float) -> str:
    return f"{x:.0f}" if abs(x) >= 10 else f"{x:.1f}"


def join_with_straggler(throttle: Sequence[Finding],
                        stragglers: Sequence[Finding]) -> list[Finding]:
    """One finding for a rank that is both the straggler and on a throttled GPU; the rest
    unchanged (joined first, then the other stragglers, then the other throttle findings)."""
    joined, rest_s, used = [], [], set()
    for s in stragglers:
        rank = s.ranks[0] if len(s.ranks) == 1 else None
        t = next((i for i, f in enumerate(throttle) if rank is not None and rank in f.ranks
                  and i not in used), None)
        if t is None:
            rest_s.append(s)
            continue
        used.add(t)
        joined.append(_join(s, throttle[t], rank))
    return joined + rest_s + [f for i, f in enumerate(throttle) if i not in used]


def _join(s: Finding, t: Finding, rank: int) -> Finding:
    d = t.details
    late = s.details.get("lateness_ms")
    how_late = f" (+{_ms(late)} ms per collective)" if isinstance(late, (int, float)) else ""
    what = " and ".join(REASON_LABELS.get(r, r) for r in d.get("headline_reasons", []))
    replay = replay_note(d.get("source", "live"))
    summary = (f"rank {rank} is the straggler{how_late}; its GPU reports {what} at "
               f"{d.get('temperature_c')} C, SM clock {d.get('sm_clock_mhz')}/"
               f"{d.get('max_sm_clock_mhz')} MHz{replay}")
    severity = max(s.severity, t.severity, key=_SEVERITY.__getitem__)
    return Finding("straggler", severity, summary, [rank], s.group, s.seq, list(s.callsites),
                   dict(s.stacks), details={**s.details, "throttle": dict(d)},
                   remedy=t.remedy)
