"""The per-step wait-for graph: who waited on whom, for how long, and the root of a chain.

Every completed rendezvous (a collective, or a send paired with its recv) says, from each
member's own clock, how long it waited inside the op (exit - enter). Everyone leaves
together, so the member that waited least arrived last: each other member waited on it
for as long as it waited beyond it. That is an edge `waiter -> late rank` of that many ms
in the waiter's step. A p2p pairing is a rendezvous of two: a pipeline stage blocked in
`recv` (or in the wait of a batched isend/irecv, or in a send the receiver had not posted
yet) waited on its peer. No clocks of two ranks are compared (DESIGN principle 2).

Time a rank spends waiting on a peer is that peer's lateness, not its own: a pipeline
stage that waits 30 ms for its slow neighbour's activations arrives 30 ms late at its DP
group's all-reduce. The straggler tracker nets the two (straggler.py); this graph keeps
the edges, so that the chain can be followed to its end and its victims named:

- `root_of`: from a rank, follow the heaviest edge out (the rank it waited on most) while
  that wait covers most of its own lateness; the rank where the chain stops did not wait
  for its lateness: the root;
- `victims`: the ranks that waited on the root (directly) and those that waited on them
  in turn (through them), with their mean wait per step.

This is the dependency graph's first-order what-if (arXiv 2505.05713 replays it whole):
were the root on time, each direct victim would wait the edge's weight less and pass that
much less on; a victim's own lateness is bounded by what it waited.
"""

from __future__ import annotations

from bisect import bisect_left, insort

from distdoctor.diagnosis.stragglers import drop_oldest
from distdoctor.findings import who

KEEP_TIMES = 4096  # op enter/exit times kept per rank (Activity)
TRIM = 512
KEEP_STEPS = 64  # steps of edges kept per rank
CHAIN_SHARE = 0.5  # a rank late mostly (this share) because it waited on Q is Q's victim
MAX_HOPS = 16
# torch's description of a group made without one, and a missing value printed
_NO_WORDS = ("", "undefined", "None", "group None")


class WaitGraph:
    def __init__(self, keep: int = KEEP_STEPS):
        self.keep = keep
        # waiter -> step key -> {waited-on rank: ms}
        self.edges: dict[int, dict] = {}  # (oldest step first)
        # waiter -> {waited-on rank: how it waited there ("p2p" | group desc)}
        self.via: dict[int, dict[int, str]] = {}

    def add(self, waiter: int, late: int, key: int, ms: float, via: str) -> None:
        steps = self.edges.get(waiter)
        if steps is None:
            steps = self.edges[waiter] = {}
        out = steps.get(key)
        if out is None:
            out = steps[key] = {}
            if len(steps) > self.keep:
                drop_oldest(steps)
        out[late] = out.get(late, 0.0) + ms
        kinds = self.via.get(waiter)
        if kinds is None:
            kinds = self.via[waiter] = {}
        if late not in kinds:  # a missing description: never said as a word of code
            kinds[late] = via if via not in _NO_WORDS else "waiting"

    def waits(self, waiter: int, last: int = 0) -> dict[int, float]:
        """Mean ms per step `waiter` waited on each rank, over its last `last` finished
        steps (all kept when 0; the newest step, still open, is left out)."""
        steps = self.edges.get(waiter)
        if not steps:
            return {}
        rows = list(steps.values())[:-1]
        if last:
            rows = rows[-last:]
        if not rows:
            return {}
        out: dict[int, float] = {}
        for row in rows:
            for r, ms in row.items():
                out[r] = out.get(r, 0.0) + ms
        return {r: ms / len(rows) for r, ms in out.items()}

    def root_of(self, rank: int, lateness_ms: dict[int, float], candidates,
                last: int = 0) -> int:
        """Follow `rank`'s heaviest wait on another late rank (`candidates`) while that
        wait holds most of its own lateness and leads to a later rank (`lateness_ms`:
        each rank's net lateness per step): where the chain stops is the root."""
        seen = {rank}
        at = rank
        for _ in range(MAX_HOPS):
            own = lateness_ms.get(at, 0.0)
            waits = [(ms, r) for r, ms in self.waits(at, last).items()
                     if r in candidates and r not in seen and lateness_ms.get(r, 0.0) >= own]
            if not waits:
                return at
            ms, nxt = max(waits)
            if ms < CHAIN_SHARE * own:
                return at
            seen.add(nxt)
            at = nxt
        return at

    def victims(self, root: int, floor_ms: float, lateness_ms: dict[int, float],
                last: int = 0) -> tuple[dict, dict]:
        """({direct victim: ms per step it waited on root}, {further victim: ms per step
        it waited on the victims before it}): ranks that wait more than they keep others
        waiting (net lateness below zero), for waits of at least `floor_ms` per step."""
        waiting = [w for w in self.edges if w != root and lateness_ms.get(w, 0.0) < 0]
        direct: dict[int, float] = {}
        for waiter in waiting:
            ms = self.waits(waiter, last).get(root, 0.0)
            if ms >= floor_ms:
                direct[waiter] = ms
        through: dict[int, float] = {}
        frontier = set(direct)
        while frontier:
            nxt = set()
            for waiter in waiting:
                if waiter in direct or waiter in through:
                    continue
                waits = self.waits(waiter, last)
                ms = sum(waits.get(v, 0.0) for v in frontier)
                if ms >= floor_ms:
                    through[waiter] = ms
                    nxt.add(waiter)
            frontier = nxt
        return direct, through

    def how(self, waiter: int, late: int) -> str | None:
        return self.via.get(waiter, {}).get(late)


class Activity:
    """When each rank's main thread last did something before a moment: the enter and
    exit times of its ops. A gloo send or recv issued without blocking (isend/irecv,
    batch_isend_irecv) completes when the caller waits on it, so its exit - enter is not a
    wait: the rank went on (other ops, compute) and blocked only from its last activity
    before the exit. The blocked time of an op is therefore exit - max(enter, the rank's
    latest other enter or exit before that exit)."""

    def __init__(self, keep: int = KEEP_TIMES):
        self.keep = keep
        self.times: dict[int, list[int]] = {}  # rank -> sorted times
        self._seen: dict[int, int] = {}  # rank -> newest event index whose enter is kept

    def op(self, ev) -> None:
        times = self.times.get(ev.rank)
        if times is None:
            if ev.kind != "p2p":  # kept from a rank's first p2p op on: costs nothing to
                return  # a job of collectives only (the engine's hot path)
            times = self.times[ev.rank] = []
        if ev.index > self._seen.get(ev.rank, -1):
            self._seen[ev.rank] = ev.index
            insort(times, ev.t_enter_ns)
        if ev.t_end_ns is not None:
            insort(times, ev.t_end_ns)
        if len(times) > self.keep + TRIM:  # trimmed now and then, not per op
            del times[:len(times) - self.keep]

    def newest(self, rank: int) -> int:
        times = self.times.get(rank)
        return times[-1] if times else 0

    def blocked_ns(self, ev) -> int:
        """How long the rank was blocked at the end of op `ev` (exit - enter when nothing
        else of its own happened in between)."""
        end = ev.t_end_ns
        times = self.times.get(ev.rank)
        if not times:
            return end - ev.t_enter_ns
        i = bisect_left(times, end)
        start = ev.t_enter_ns
        if i and times[i - 1] > start:
            start = times[i - 1]
        return end - start


def delays_text(graph: WaitGraph, root: int, direct: dict, through: dict) -> str:
    """'it delays rank 0 (p2p, 52 ms per step) and rank 3 (mesh_dp, 41 ms per step)
    and, through them, rank 1 (44 ms per step)' ('' with no victims)."""
    if not direct:
        return ""
    parts = [f"rank {r} ({graph.how(r, root) or 'waiting'}, {ms:.0f} ms per step)"
             for r, ms in sorted(direct.items())]
    text = "it delays " + (", ".join(parts[:-1]) + " and " + parts[-1] if len(parts) > 1
                           else parts[0])
    if through:
        them = "it" if len(direct) == 1 else "them"
        text += f" and, through {them}, {who(through)}"
    return text
