"""straggler: the rank the others keep waiting for.

Clock-independent (DESIGN principle 2): every rank measures its own wait in a collective
(completion - enter, on its own clock). Everyone leaves a collective at about the same
moment, so a rank that arrives late waits less than the others, by about how late it was.
The last to arrive kept everyone waiting for as long as the next-to-last waited beyond it:
that gap is its lateness in this collective; every other rank's is minus how much longer
it waited than the last one. Measuring against the next-to-last, not the typical rank,
keeps a cohort that is late together by design (the first pipeline stage at a step's
loss all-reduce) from looking like stragglers. A rank's lateness is summed per step (its span, e.g. the trainer's
"step 12"; without spans, per 64 collectives): a rank slow once per step and one slow a
little at every collective both show as a steady per-step sum, where per-collective values
are dominated by scheduling noise. A rank is a straggler when its mean per-step lateness is
above a floor and clearly not noise (a t-statistic: mean / standard error over its recent
steps). Groups of two are symmetric (one's lateness is the other's negative), so the
verdict comes from all the groups a rank is in together.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from dataclasses import dataclass

from distdoctor.diagnosis.findings import Finding, callsite_of
from distdoctor.diagnosis.rendezvous import Rendezvous

WINDOW = 400  # recent collectives per rank kept for the report
STEPS = 40  # recent steps per rank that the verdict looks at
MIN_STEPS = 8  # no verdict on fewer
CHUNK = 64  # collectives per "step" for ranks that mark no spans
MIN_T = 4.0  # how many standard errors the mean per-step lateness must stand above zero
MIN_LATENESS_MS = 2.0  # per step; below this, lateness is noise (scheduling, logging)


def _first(item):
    return item[0]


@dataclass(slots=True)
class _Steps:
    """Per-step sums of one rank's lateness: the closed ones and the one being filled."""

    sums: deque
    key: int = -1  # the open step: its span index, or a chunk number without spans
    total: float = 0.0
    count: int = 0
    chunk: int = 0
    warm: bool = False  # the first step has closed (it is not kept: see add)

    def add(self, span_index: int, lateness: float) -> None:
        if span_index:
            key = span_index
        else:  # no spans: fixed-size chunks
            if self.count >= CHUNK and self.key < 0:
                self.chunk += 1
            key = -1 - self.chunk
        if key != self.key and self.count:
            # The first step is warm-up: gloo and NCCL connect lazily at a group's first
            # collectives, so who waits there says who connected first. One such sum
            # (-1.3 s beside +0.2..0.6 s for a rank 150 ms late every step) swamped the
            # t-statistic of a 20-step run.
            if self.warm:
                self.sums.append(self.total)
            self.warm = True
            self.total, self.count = 0.0, 0
        self.key = key
        self.total += lateness
        self.count += 1


# One rank's part in one collective, kept as a plain tuple: one is made per member of
# every collective (256 for a 256-rank all-reduce), and a tuple costs a fifth of an object.
# (lateness_ms: how long the others waited for it, negative when it waited; last: it
# arrived last; group; callsite)
_LATENESS, _LAST, _GROUP, _CALLSITE = range(4)


class StragglerTracker:
    def __init__(self, min_lateness_ms: float = MIN_LATENESS_MS, window: int = WINDOW,
                 min_t: float = MIN_T):
        self.min_lateness_ms = min_lateness_ms
        self.window = window
        self.min_t = min_t
        self.obs: dict[int, deque[tuple]] = {}
        self.steps: dict[int, _Steps] = {}

    def observe(self, rv: Rendezvous) -> None:
        """Feed one completed collective (every member arrived and finished)."""
        arrivals = rv.arrivals
        if rv.is_p2p or len(arrivals) < 2:
            return
        waits = [(e.t_end_ns - e.t_enter_ns, r, e) for r, e in arrivals.items()]
        waits.sort(key=_first)
        w_last, last = waits[0][0], waits[0][1]
        gap = (waits[1][0] - w_last) / 1e6
        obs, steps, group = self.obs, self.steps, rv.group
        for w, rank, ev in waits:
            q = obs.get(rank)
            if q is None:
                q = obs[rank] = deque(maxlen=self.window)
                steps[rank] = _Steps(deque(maxlen=STEPS))
            lateness = gap if rank == last else (w_last - w) / 1e6
            q.append((lateness, rank == last, group, ev.callsite))
            steps[rank].add(ev.span_index, lateness)

    def score(self, rank: int) -> dict | None:
        q, steps = self.obs.get(rank), self.steps.get(rank)
        if not q or steps is None or len(steps.sums) < MIN_STEPS:
            return None
        xs = list(steps.sums)
        n = len(xs)
        mean = sum(xs) / n
        var = sum((x - mean) ** 2 for x in xs) / (n - 1)
        t = mean / math.sqrt(var / n) if var > 0 else (math.inf if mean > 0 else 0.0)
        per = [o[_LATENESS] for o in q]
        half = n // 2
        return {"step_lateness_ms": mean, "t": t, "steps": n,
                "lateness_ms": sum(per) / len(per), "collectives": len(per),
                "last_fraction": sum(o[_LAST] for o in q) / len(q),
                "early_mean_ms": sum(xs[:half]) / max(half, 1),
                "late_mean_ms": sum(xs[half:]) / max(n - half, 1)}

    def findings(self) -> list[Finding]:
        out = []
        for rank in sorted(self.obs):
            s = self.score(rank)
            if (s is None or s["step_lateness_ms"] < self.min_lateness_ms
                    or s["t"] < self.min_t):
                continue
            out.append(self._finding(rank, s))
        return out

    def _finding(self, rank: int, s: dict) -> Finding:
        late = [o for o in self.obs[rank] if o[_LATENESS] > 0]
        groups = Counter(o[_GROUP] for o in late)
        group = groups.most_common(1)[0][0] if groups else None
        sites = Counter((o[_CALLSITE].get("file"), o[_CALLSITE].get("line"))
                        for o in late if o[_CALLSITE])
        callsite = None
        if sites:
            file, line = sites.most_common(1)[0][0]
            callsite = next(o[_CALLSITE] for o in late if o[_CALLSITE] and
                            (o[_CALLSITE].get("file"), o[_CALLSITE].get("line")) == (file, line))
        early, later = s["early_mean_ms"], s["late_mean_ms"]
        trend = ("rising" if later > 1.25 * early + 0.1 else
                 "falling" if early > 1.25 * later + 0.1 else "steady")
        summary = (f"straggler: rank {rank} keeps the others waiting "
                   f"{s['step_lateness_ms']:.1f} ms per step ({s['lateness_ms']:.2f} ms per "
                   f"collective) over its last {s['steps']} steps; last to arrive in "
                   f"{s['last_fraction']:.0%} of its collectives; {trend}")
        details = {"lateness_ms": round(s["lateness_ms"], 3),
                   "step_lateness_ms": round(s["step_lateness_ms"], 3), "steps": s["steps"],
                   "t_statistic": round(s["t"], 1), "last_fraction": round(s["last_fraction"], 3),
                   "collectives": s["collectives"], "trend": trend, "groups": dict(groups)}
        return Finding("straggler", "warning", summary, [rank], group, None,
                       [callsite_of(rank, callsite)], details=details,
                       remedy="Look at what the rank does before these collectives: uneven "
                       "data or work, a slow or throttled GPU (see throttle findings), a busy "
                       "host (CPU, I/O), or rank-0-only work such as logging or checkpointing.")
