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

The table is counted per host, never filled for all: a host's logs name at most
MAX_RUNS_PER_HOST runs (past it, its own oldest goes), and the hosts that hold no rank
any more go once there are HOSTS_SLACK of them. So a peer that names run after run
keeps no real run out (on 46da595 the first 64 run ids held the table for good, and a
real run's restarts were never known), and the table grows with nodes, not ranks.
"""

from __future__ import annotations

MAX_RUNS_PER_HOST = 4  # a node runs one job (its elastic run), a few re-runs of it
HOSTS_SLACK = 1024  # hosts with no rank left whose counts are kept until the next sweep


class RunCounts:
    """elastic run -> host -> the highest restart count granted to that host's logs."""

    def __init__(self, holding: dict[str, int]):
        """`holding`: host -> ranks it owns (owners.Owners.count), for the sweep."""
        self.holding = holding
        self.of: dict[str, dict[str, int]] = {}
        self._runs_of: dict[str, dict[str, None]] = {}  # host -> its runs, oldest first
        # run -> its two highest (count, host), two hosts: borne() in O(1) a claim
        self._top: dict[str, list[tuple[int, str]]] = {}

    def add(self, host: str, launch: tuple | None) -> None:
        """`host` runs a log of `launch` (run, restart count)."""
        if launch is None:
            return
        run, count = launch
        runs = self._runs_of.get(host)
        if runs is None:
            if len(self._runs_of) >= len(self.holding) + HOSTS_SLACK:
                self._sweep()
            runs = self._runs_of[host] = {}
        if run not in runs:
            if len(runs) >= MAX_RUNS_PER_HOST:
                self._drop(host, next(iter(runs)))
            runs[run] = None
        hosts = self.of.setdefault(run, {})
        if count > hosts.get(host, -1):
            hosts[host] = count
            self._top[run] = _two(self._top.get(run, []), host, count)

    def _sweep(self) -> None:
        """The counts of hosts that hold no rank now let go (nothing behind them)."""
        for host in [h for h in self._runs_of if h not in self.holding]:
            for run in list(self._runs_of[host]):
                self._drop(host, run)

    def _drop(self, host: str, run: str) -> None:
        runs = self._runs_of.get(host, {})
        runs.pop(run, None)
        if not runs:
            self._runs_of.pop(host, None)
        hosts = self.of.get(run, {})
        hosts.pop(host, None)
        if not hosts:
            self.of.pop(run, None)
            self._top.pop(run, None)
        elif any(h == host for _, h in self._top.get(run, [])):
            self._top[run] = sorted(((c, h) for h, c in hosts.items()), reverse=True)[:2]

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
