"""The dashboard's process and GPU columns: each rank's newest probe readings (its
process's CPU and memory, its GPU's temperature, clock and load), matched to the rank
through the samples' own map of rank to GPU."""

from __future__ import annotations

from dataclasses import replace


def with_probes(rows: list, samples: list) -> list:
    """Fill each rank's process and GPU columns from the newest sample naming it."""
    proc: dict[int, object] = {}
    gpu: dict[int, object] = {}
    for s in samples:  # oldest first: newer readings overwrite
        for p in getattr(s, "processes", ()):
            proc[p.rank] = p
        by_key = {}
        for g in getattr(s, "gpus", ()):
            by_key[gpu_key(g)] = g
        for r, key in getattr(s, "gpu_of_rank", {}).items():
            if key in by_key:
                gpu[r] = by_key[key]
    if not proc and not gpu:
        return rows
    out = []
    for row in rows:
        p, g = proc.get(row.rank), gpu.get(row.rank)
        out.append(replace(row, cpu_pct=getattr(p, "cpu_pct", None),
                           rss_bytes=getattr(p, "rss_bytes", None),
                           gpu=gpu_text(g) if g is not None else None))
    return out


def gpu_key(g) -> str:
    """How the probe samples name a GPU (its UUID, else "index:N"), as in `gpu_of_rank`."""
    try:
        from distdoctor.probes.sampler import gpu_key as probes_key
    except ImportError:
        return str(getattr(g, "index", "?"))
    return probes_key(g)


def gpu_text(g) -> str:
    """A GPU's dashboard cell: \"71 C 1980 MHz 96%\", said to be replayed when it is."""
    parts = []
    if g.temperature_c is not None:
        parts.append(f"{g.temperature_c} C")
    if g.sm_clock_mhz is not None:
        parts.append(f"{g.sm_clock_mhz} MHz")
    if g.utilization_pct is not None:
        parts.append(f"{g.utilization_pct}%")
    text = " ".join(parts) or "?"
    if not str(g.source).startswith("live"):
        text += " (replayed)"  # never shown as live (DESIGN principle 4)
    return text
