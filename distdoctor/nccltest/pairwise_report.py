"""Reading the pairwise matrices: which links are slow, and which rank they point at.

A directed pair is slow when its bandwidth is below `fraction` x the median of all
directed pairs; a pair's latency is slow when it exceeds the median / `fraction`. A rank
is a suspect when every one of its sends (or receives, or round trips) is slow and it has
at least two peers, so the blame can be placed; with two ranks only the pair is named.
Pure functions over lists: no torch.
"""

from __future__ import annotations

import statistics

from distdoctor.nccltest.results import RankInfo


def _where(info: RankInfo) -> str:
    return f"{info.host} {info.device}" + (f" [{info.bus_id}]" if info.bus_id != "-" else "")


def analyze(bw: list[list[float]], lat: list[list[float]], ranks: list[RankInfo],
            fraction: float, nbytes: int, iters: int) -> dict:
    n = len(bw)
    directed = [(s, d, bw[s][d]) for s in range(n) for d in range(n) if s != d]
    pairs = [(a, b, lat[a][b]) for a in range(n) for b in range(a + 1, n)]
    median_bw = statistics.median(v for _, _, v in directed) if directed else 0.0
    median_lat = statistics.median(v for _, _, v in pairs) if pairs else 0.0
    slow = [{"src": s, "dst": d, "gbps": v,
             "fraction_of_median": v / median_bw if median_bw else 0.0,
             "src_host": ranks[s].host, "dst_host": ranks[d].host,
             "src_device": ranks[s].device, "dst_device": ranks[d].device}
            for s, d, v in directed if v < fraction * median_bw]
    slow_lat = [{"a": a, "b": b, "us": v,
                 "times_median": v / median_lat if median_lat else 0.0,
                 "a_host": ranks[a].host, "b_host": ranks[b].host,
                 "a_device": ranks[a].device, "b_device": ranks[b].device}
                for a, b, v in pairs if median_lat and v > median_lat / fraction]
    return {"bytes": nbytes, "latency_bytes": 8, "iters": iters, "fraction": fraction,
            "bandwidth_gbps": bw, "latency_us": lat, "median_gbps": median_bw,
            "median_latency_us": median_lat, "slow_pairs": slow, "slow_latency": slow_lat,
            "suspects": suspects(n, slow, slow_lat, ranks)}


def suspects(n: int, slow: list[dict], slow_lat: list[dict], ranks: list[RankInfo]) -> list:
    """Ranks to blame: every send (receive, round trip) of theirs is slow.

    Candidates are taken worst first; a later one must still have at least two slow pairs
    that an earlier suspect does not already explain, so one slow sender does not also
    make each of its receivers look guilty.
    """
    if n < 3:
        return []
    candidates = []  # (severity, rank, what, pairs)
    for r in range(n):
        for what, pairs in (("sends", [p for p in slow if p["src"] == r]),
                            ("receives", [p for p in slow if p["dst"] == r]),
                            ("round trips", [p for p in slow_lat if r in (p["a"], p["b"])])):
            if len(pairs) == n - 1:
                severity = statistics.median(p.get("fraction_of_median")
                                             or 1.0 / max(p.get("times_median", 1.0), 1e-9)
                                             for p in pairs)
                candidates.append((severity, r, what, pairs))
    explained: list[int] = []  # ids of pairs already put down to a suspect
    found: dict[int, list[str]] = {}
    for _, r, what, pairs in sorted(candidates, key=lambda c: (c[0], c[1])):
        if sum(1 for p in pairs if id(p) not in explained) < 2:
            continue
        explained += [id(p) for p in pairs]
        found.setdefault(r, []).append(f"all {n - 1} of its {what} are slow")
    return [{"rank": r, "host": ranks[r].host, "device": ranks[r].device,
             "bus_id": ranks[r].bus_id, "reasons": reasons}
            for r, reasons in sorted(found.items())]


def _matrix(title: str, values: list[list[float]], fmt: str) -> list[str]:
    n = len(values)
    lines = [title, "#  " + f"{'src/dst':>8s}" + "".join(f"{d:>9d}" for d in range(n))]
    for s in range(n):
        cells = "".join(f"{'-':>9s}" if s == d else format(values[s][d], fmt).rjust(9)
                        for d in range(n))
        lines.append(f"#  {s:>8d}{cells}")
    return lines


def format_lines(result: dict, ranks: list[RankInfo]) -> list[str]:
    pct = round(100 * result["fraction"])
    lines = ["# Pairwise test (send/recv between every pair of ranks)", "#"]
    lines += _matrix(f"# Bandwidth (GB/s), {result['bytes']} B x {result['iters']} back to "
                     "back; row = sender, column = receiver",
                     result["bandwidth_gbps"], ".2f")
    lines += ["#"]
    lines += _matrix(f"# Latency (us, {result['latency_bytes']} B round trip / 2)",
                     result["latency_us"], ".1f")
    lines += ["#", f"# Median bandwidth {result['median_gbps']:.3g} GB/s, median latency "
                   f"{result['median_latency_us']:.3g} us"]
    if result["slow_pairs"]:
        lines.append(f"# Slow pairs (below {pct}% of the median bandwidth):")
        for p in result["slow_pairs"]:
            lines.append(f"#   {p['src']:>3d} -> {p['dst']:<3d} {p['gbps']:8.3g} GB/s "
                         f"({100 * p['fraction_of_median']:.0f}% of median)  "
                         f"{_where(ranks[p['src']])} -> {_where(ranks[p['dst']])}")
    if result["slow_latency"]:
        lines.append(f"# Slow round trips (over {1 / result['fraction']:.2g}x the median "
                     "latency):")
        for p in result["slow_latency"]:
            lines.append(f"#   {p['a']:>3d} <-> {p['b']:<3d} {p['us']:8.3g} us "
                         f"({p['times_median']:.1f}x median)  "
                         f"{_where(ranks[p['a']])} <-> {_where(ranks[p['b']])}")
    for s in result["suspects"]:
        lines.append(f"# Suspect: rank {s['rank']} ({_where(ranks[s['rank']])}): "
                     + "; ".join(s["reasons"]))
    if not result["slow_pairs"] and not result["slow_latency"]:
        lines.append(f"# No slow pairs: every pair is within {pct}% of the median.")
    return lines + ["#"]
