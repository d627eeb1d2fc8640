"""How far the job's elastic runs have restarted, as the nodes show it: what a launch's
restart count (owners.incarnation) may do in claims.py.

torchrun numbers launches per agent, not per job: each node's agent sets
TORCHELASTIC_RESTART_COUNT to the restarts it made itself (its max_restarts less those
left), one more on each failure of its workers; a membership change restarts the workers
without counting, and a replacement node's fresh agent starts again from 0. So no node's
number is the run's: one node may be ahead of the others (only its workers failed), and
a number nobody else shows is a single node's word, which a peer may forge as it likes
(a token proves a peer is one of the job's nodes, not what it runs).

What one host's number may do is bounded by the others':
- the run has restarted to count C once two hosts have shown C (`borne`): then a
  finished rank of an older launch may be relaunched elsewhere. One host that sends an
  enormous count moves nothing alone.
- a claim's count counts for at most one restart past what is borne out (`bounded`):
  what one real elastic restart does. A newer launch that takes a running rank at once
  is then at most one restart newer, and a false one is still shown so when the node
  that runs the rank runs on through it (claims.py).
"""

from __future__ import annotations

MAX_RUNS = 64  # elastic runs whose hosts' counts are known (a job has one)


class RunCounts:
    """elastic run -> host -> the highest restart count granted to that host's logs."""

    def __init__(self):
        self.of: dict[str, dict[str, int]] = {}
        # run -> its two highest (count, host), two hosts: borne() in O(1) a claim
        self._top: dict[str, list[tuple[int, str]]] = {}

    def add(self, host: str, launch: tuple | None) -> None:
        """`host` runs a log of `launch` (run, restart count)."""
        if launch is None:
            return
        run, count = launch
        hosts = self.of.get(run)
        if hosts is None:
            if len(self.of) >= MAX_RUNS:
                return
            hosts = self.of[run] = {}
        if count > hosts.get(host, -1):
            hosts[host] = count
            self._top[run] = _two(self._top.get(run, []), host, count)

    def borne(self, run: str, host: str | None = None, count: int = -1) -> int | None:
        """The highest restart count of `run` that two hosts have shown (`host` counted
        at `count` at least: a claim's own), None while fewer than two hosts show one."""
        top = self._top.get(run, [])
        if host is not None:
            top = _two(top, host, count)
        return top[1][0] if len(top) > 1 else None

    def bounded(self, host: str, launch: tuple | None) -> tuple | None:
        """`host`'s `launch`, its count at most one restart past the run's borne out one
        (as it is where no other host shows the run: nothing to weigh it against)."""
        if launch is None:
            return None
        run, count = launch
        borne = self.borne(run, host, count)
        return launch if borne is None else (run, min(count, borne + 1))


def _two(top: list[tuple[int, str]], host: str, count: int) -> list[tuple[int, str]]:
    """The two highest (count, host) of two hosts, `host` raised to `count`: every host
    not in `top` is at most its second."""
    best = {h: c for c, h in top}
    best[host] = max(count, best.get(host, -1))
    return sorted(((c, h) for h, c in best.items()), reverse=True)[:2]
