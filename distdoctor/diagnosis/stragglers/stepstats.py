"""Per-step lateness of a rank and the statistics its straggler verdict takes from it:
the window of recent steps and a longer history (`Steps`), the typical steps without the
occasional late one (`typical`), a t-statistic against zero (`t`) and the onset of a rise
(`onset`). Pure functions over numbers (straggler.py judges with them)."""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass, field

from distdoctor.diagnosis.stragglers import drop_oldest

STEPS = 60  # recent steps per rank that the verdicts look at
LONG_STEPS = 300  # ... and its longer history, which a verdict must agree with
# the history's steps before the window: the window holds STEPS + 1 at least once any left it
OLD_STEPS = LONG_STEPS - STEPS
MIN_SIDE = 5  # steps on each side of an onset
# A step this far above the rank's typical one (in median absolute deviations, and by the
# floor at least) is occasional work, left out of the verdict when such steps are few
SPIKE_MADS = 5.0
MAX_SPIKE_SHARE = 0.25


@dataclass(slots=True)
class Steps:
    """Per-step sums of one rank's lateness, by step key, in the order steps were first
    seen. Collectives reach the tracker when their rendezvous completes, which need not
    be the rank's own order (one group's ops complete in a burst when a lagging member's
    events are read), so a step's sum stays open to late additions; the newest step is
    not scored yet."""

    totals: dict = field(default_factory=dict)  # key -> lateness sum, oldest first
    first: int | None = None  # the warm-up step's key: not scored
    # the steps before the window, closed to late additions: plain arrays (16 bytes a
    # step, against 130 in the dict: a post-mortem may hold thousands of ranks)
    old_keys: array = field(default_factory=lambda: array("q"))
    old_sums: array = field(default_factory=lambda: array("d"))

    def add(self, key: int, lateness: float) -> None:
        # The first step is warm-up: gloo and NCCL connect lazily at a group's first
        # collectives, so who waits there says who connected first. One such sum
        # (-1.3 s beside +0.2..0.6 s for a rank 150 ms late every step) swamped the
        # t-statistic of a 20-step run.
        if self.first is None:
            self.first = key
        if key == self.first:
            return
        totals = self.totals
        if key in totals:
            totals[key] += lateness
        else:
            totals[key] = lateness
            if len(totals) > STEPS + 1 + STEPS:
                self._close_oldest()

    def _close_oldest(self) -> None:
        """The window's steps before its newest STEPS + 1, closed into the arrays at once:
        one move a window, not one a step (a loop of one collective per iteration steps
        1,000 times a second; engine/_ingest.c does the same). The window reads its
        newest (sums); a late addition to a step between them still counts there."""
        totals = self.totals
        moved = [drop_oldest(totals) for _ in range(len(totals) - STEPS - 1)]
        self.old_keys.extend(k for k, _ in moved)
        self.old_sums.extend(ms for _, ms in moved)
        if len(self.old_keys) > 2 * OLD_STEPS:  # (the history reads the newest)
            del self.old_keys[:-OLD_STEPS], self.old_sums[:-OLD_STEPS]

    @property
    def long_sums(self) -> list[tuple[int, float]]:
        """Its finished steps, up to LONG_STEPS of them (the newest is still open)."""
        done = list(self.totals.items())[:-1]
        start = len(self.old_keys) - max(0, min(len(self.old_keys), LONG_STEPS - len(done)))
        return [*zip(self.old_keys[start:], self.old_sums[start:], strict=True), *done]

    @property
    def sums(self) -> list[tuple[int, float]]:
        return list(self.totals.items())[-STEPS - 1:-1]


def typical(steps: list, floor: float) -> list:
    """The (key, lateness) steps that are the rank's typical ones: without the occasional
    step far later than the rest (SPIKE_MADS median absolute deviations above the median,
    and the floor), alone or two in a row, where such steps are few. That is work a rank
    does now and then by design (nanoGPT's rank 0 evaluates and writes a checkpoint every
    N steps; logging, a metric, a garbage collection), a rhythm of the job, not a rank
    slower than its peers: with it in, a rank that the machine's noise made a little late
    in most steps had its mean and its "own work" raised by the evaluation (a false
    straggler, cause compute, on healthy nanoGPT). A rank slow since some step is late in
    a run of steps, which stays."""
    n = len(steps)
    xs = sorted(x for _, x in steps)
    med = (xs[(n - 1) // 2] + xs[n // 2]) / 2
    devs = sorted(abs(x - med) for x in xs)
    mad = (devs[(n - 1) // 2] + devs[n // 2]) / 2
    cut = med + max(floor, SPIKE_MADS * mad)
    high = [x > cut for _, x in steps]
    drop = set()
    i = 0
    while i < n:
        if not high[i]:
            i += 1
            continue
        j = i
        while j < n and high[j]:
            j += 1
        if j - i <= 2:
            drop.update(range(i, j))
        i = j
    if not drop or len(drop) > MAX_SPIKE_SHARE * n:
        return steps
    return [st for i, st in enumerate(steps) if i not in drop]


def t(xs: list) -> float:
    n = len(xs)
    mean = sum(xs) / n
    var = sum((x - mean) ** 2 for x in xs) / (n - 1) if n > 1 else 0.0
    return mean / math.sqrt(var / n) if var > 0 else (math.inf if mean > 0 else 0.0)


def onset(xs: list) -> tuple | None:
    """(split, rise in ms per step, Welch t) of the split of xs where the later steps
    rose above the earlier ones; None with too few steps.

    The split is the one that explains most of the series by a rise (the least-squares
    change point: k(n-k)/n times the squared rise): the best t would often pick a later
    split, where one noisy step early in the rise has left the later side. Simulated on
    60 steps with 15% time-slice spikes, it is off by more than 2 steps in 3% of series,
    against 11% for the best t. The t at that split says how sure the rise is."""
    n = len(xs)
    if n < 2 * MIN_SIDE:
        return None
    # prefix sums: every split in O(1)
    s1, s2 = [0.0], [0.0]
    for x in xs:
        s1.append(s1[-1] + x)
        s2.append(s2[-1] + x * x)
    k = max(range(MIN_SIDE, n - MIN_SIDE + 1),
            key=lambda k: _explained(k, n, (s1[n] - s1[k]) / (n - k) - s1[k] / k))
    a_n, b_n = k, n - k
    a_mean, b_mean = s1[k] / a_n, (s1[n] - s1[k]) / b_n
    a_var = max(0.0, (s2[k] - a_n * a_mean ** 2) / (a_n - 1))
    b_var = max(0.0, (s2[n] - s2[k] - b_n * b_mean ** 2) / (b_n - 1))
    se = math.sqrt(a_var / a_n + b_var / b_n)
    rise = b_mean - a_mean
    return k, rise, rise / se if se > 0 else (math.inf if rise > 0 else 0.0)


def _explained(k: int, n: int, rise: float) -> float:
    """What a rise at split k explains of the series (signed: a fall counts against)."""
    return k * (n - k) / n * rise * abs(rise)
