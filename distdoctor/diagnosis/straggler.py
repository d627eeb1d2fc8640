"""straggler: the rank the others keep waiting for.

Clock-independent (DESIGN principle 2): every rank measures its own wait in a collective
(completion - enter, on its own clock). Everyone leaves a collective at about the same
moment, so the last to arrive waits least, and how long the others waited for it is their
wait minus its wait. A rank is a straggler when it is last far more often than chance
(1/n in a group of n) over its recent collectives, by more than a floor in milliseconds.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass
from statistics import median

from distdoctor.diagnosis.findings import Finding, callsite_of
from distdoctor.diagnosis.rendezvous import Rendezvous

WINDOW = 200  # recent collectives per rank that the score looks at
MIN_SAMPLES = 30  # no verdict on fewer
MIN_SCORE = 0.5  # 0 = last as often as chance, 1 = always last
MIN_LATENESS_MS = 1.0  # below this, lateness is noise (scheduling, logging)
TIE_MS = 0.05  # closer than this, nobody is last


@dataclass(slots=True)
class _Obs:
    n: int  # group size
    last: bool
    lateness_ms: float  # how long the others waited for this rank (0 when not last)
    group: str
    callsite: dict | None


class StragglerTracker:
    def __init__(self, min_lateness_ms: float = MIN_LATENESS_MS, window: int = WINDOW):
        self.min_lateness_ms = min_lateness_ms
        self.window = window
        self.obs: dict[int, deque[_Obs]] = {}

    def observe(self, rv: Rendezvous) -> None:
        """Feed one completed collective (every member arrived and finished)."""
        if rv.is_p2p or len(rv.arrivals) < 2:
            return
        waits = {r: (e.t_end_ns - e.t_enter_ns) / 1e6 for r, e in rv.arrivals.items()}
        last = min(waits, key=waits.get)
        others = sorted(w for r, w in waits.items() if r != last)
        lateness = median(others) - waits[last]
        if lateness < TIE_MS:
            last = None
        n = len(waits)
        for rank, ev in rv.arrivals.items():
            q = self.obs.get(rank)
            if q is None:
                q = self.obs[rank] = deque(maxlen=self.window)
            is_last = rank == last
            q.append(_Obs(n, is_last, lateness if is_last else 0.0, rv.group, ev.callsite))

    def score(self, rank: int) -> dict | None:
        q = self.obs.get(rank)
        if not q or len(q) < MIN_SAMPLES:
            return None
        count = len(q)
        last = [o for o in q if o.last]
        expected = sum(1.0 / o.n for o in q)
        score = (len(last) - expected) / max(count - expected, 1e-9)
        late = [o.lateness_ms for o in last]
        half = count // 2
        early_mean = sum(o.lateness_ms for o in list(q)[:half]) / max(half, 1)
        late_mean = sum(o.lateness_ms for o in list(q)[half:]) / max(count - half, 1)
        return {"score": score, "last_fraction": len(last) / count, "collectives": count,
                "lateness_ms": median(late) if late else 0.0,
                "mean_delay_ms": sum(late) / count, "early_mean_ms": early_mean,
                "late_mean_ms": late_mean, "last": last}

    def findings(self) -> list[Finding]:
        out = []
        for rank in sorted(self.obs):
            s = self.score(rank)
            if s is None or s["score"] < MIN_SCORE or s["lateness_ms"] < self.min_lateness_ms:
                continue
            out.append(self._finding(rank, s))
        return out

    def _finding(self, rank: int, s: dict) -> Finding:
        last = s.pop("last")
        groups = Counter(o.group for o in last)
        group = groups.most_common(1)[0][0]
        sites = Counter((o.callsite or {}).get("file", "?") + ":" + str((o.callsite or {}).get(
            "line", "?")) for o in last)
        site_key = sites.most_common(1)[0][0]
        callsite = next((o.callsite for o in last if o.callsite and
                         f"{o.callsite.get('file')}:{o.callsite.get('line')}" == site_key), None)
        early, late = s["early_mean_ms"], s["late_mean_ms"]
        trend = ("rising" if late > 1.25 * early + 0.1 else
                 "falling" if early > 1.25 * late + 0.1 else "steady")
        summary = (f"straggler: rank {rank} arrives last in {s['last_fraction']:.0%} of its "
                   f"last {s['collectives']} collectives, {s['lateness_ms']:.1f} ms after the "
                   f"others (median); it costs every collective {s['mean_delay_ms']:.1f} ms on "
                   f"average ({trend})")
        details = {"lateness_ms": round(s["lateness_ms"], 3),
                   "mean_delay_ms": round(s["mean_delay_ms"], 3),
                   "last_fraction": round(s["last_fraction"], 3),
                   "score": round(s["score"], 3), "collectives": s["collectives"],
                   "trend": trend, "groups": dict(groups)}
        return Finding("straggler", "warning", summary, [rank], group, None,
                       [callsite_of(rank, callsite)], details=details,
                       remedy="Look at what the rank does before these collectives: uneven "
                       "data or work, a slow or throttled GPU (see throttle findings), a busy "
                       "host (CPU, I/O), or rank-0-only work such as logging or checkpointing.")
