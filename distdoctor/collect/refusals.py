"""What the collector says about the peers it refuses, and about its nodes' comings and
goings: summed, never a line each.

A refused forwarder asks again every 30 s, and a hostile peer thousands of times a second:
the first refusal of a peer address for a reason is one line at once; after that the same
address and reason are counted, and once a minute one line says how many came. Bounded:
a few reasons per address (the rest are "other reasons"), a few dozen lines a minute
(the rest summed into one), and a few thousand addresses remembered.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable

from distdoctor.safetext import printable

WINDOW_S = 60.0
REASONS_PER_ADDRESS = 8  # distinct reasons said for one address; the rest are summed
LINES_PER_WINDOW = 40  # first-time lines a minute; past them, counted in one line
MAX_KEYS = 4096
OTHER = "other reasons"


class Refusals:
    def __init__(self, say: Callable[[str], None], clock: Callable[[], float] = time.monotonic):
        self._say = say
        self._clock = clock
        self._window_start = clock()
        self._said: OrderedDict[tuple[str, str], None] = OrderedDict()  # said once already
        self._reasons: dict[str, int] = {}  # address -> its keys in _said
        self._counts: dict[tuple[str, str], int] = {}  # this window, after the first line
        self._lines = 0  # first-time lines said this window
        self._unsaid: dict[str, int] = {}  # address -> refusals past LINES_PER_WINDOW

    def refused(self, address: str, port: int | None, why: str) -> None:
        """One refusal of a peer (`why` may hold the peer's own words: made printable)."""
        self.flush_if_due()
        why = printable(why, 300)
        key = (address, why)
        if key not in self._said and self._reasons.get(address, 0) >= REASONS_PER_ADDRESS:
            key = (address, OTHER)
        if key in self._said:
            self._said.move_to_end(key)
            self._counts[key] = self._counts.get(key, 0) + 1
            return
        if self._lines >= LINES_PER_WINDOW:
            self._unsaid[address] = self._unsaid.get(address, 0) + 1
            return
        self._lines += 1
        self._said[key] = None
        self._reasons[address] = self._reasons.get(address, 0) + 1
        while len(self._said) > MAX_KEYS:
            (old, _), _ = self._said.popitem(last=False)
            self._reasons[old] -= 1
            if not self._reasons[old]:
                del self._reasons[old]
        where = f"{_host(address)}:{port}" if port is not None else _host(address)
        self._say(f"refused {where}: {key[1]}")

    def flush_if_due(self) -> None:
        """The minute's sums, one line per address and reason that came again."""
        now = self._clock()
        span = _window_due(self._window_start, now)
        if span is None:
            return
        for (address, why), n in self._counts.items():
            self._say(f"refused {_host(address)} {n} more time{'s' * (n != 1)} in {span}: "
                      f"{why}")
        if self._unsaid:
            total = sum(self._unsaid.values())
            self._say(f"refused {total} more connection{'s' * (total != 1)} from "
                      f"{len(self._unsaid)} address{'es' * (len(self._unsaid) != 1)} in "
                      f"{span} (too many reasons to say each)")
        self._counts.clear()
        self._unsaid.clear()
        self._lines = 0
        self._window_start = now


NEWS_PER_WINDOW = 200  # lines of nodes' comings and goings a minute, over all nodes
NEWS_EACH = 3  # lines a minute of one kind of news of one node (a reconnection is news)


class NodeNews:
    """What the collector says of its nodes' comings and goings (connected, finished,
    lost, dropped, replaced): the first NEWS_EACH of each kind and reason per host in a
    minute at once, the rest of that minute summed in one line with the newest of them.
    A node that reconnects in a loop (with the token, or on loopback where none is
    needed) printed two lines a connection; a flood of host names gets NEWS_PER_WINDOW
    lines a minute, the rest counted in one. Bounded: REASONS_PER_ADDRESS reasons a
    host (the rest are "other reasons")."""

    def __init__(self, say: Callable[[str], None], clock: Callable[[], float] = time.monotonic):
        self._say, self._clock = say, clock
        self._window_start = clock()
        self._said: dict[tuple[str, str, str], int] = {}  # (host, kind, reason) -> lines
        self._reasons: dict[str, int] = {}  # host -> its keys in _said
        self._repeats: dict[tuple[str, str, str], list] = {}  # -> [count, newest line]
        self._lines = 0
        self._unsaid = 0  # past NEWS_PER_WINDOW

    def news(self, host: str, kind: str, line: str, reason: str = "") -> None:
        """`line` about node `host`: `kind` (connected, lost, ...) and `reason` (why it
        was lost or dropped, without the port) tell which lines sum together."""
        self.flush_if_due()
        key = (host, kind, reason)
        if key not in self._said and self._reasons.get(host, 0) >= REASONS_PER_ADDRESS:
            key = (host, kind, OTHER)
        said = self._said.get(key, 0)
        if said >= NEWS_EACH:
            entry = self._repeats.setdefault(key, [0, line])
            entry[0] += 1
            entry[1] = line
        elif self._lines >= NEWS_PER_WINDOW:
            self._unsaid += 1
        else:
            if not said:
                self._reasons[host] = self._reasons.get(host, 0) + 1
            self._said[key] = said + 1
            self._lines += 1
            self._say(line)

    def flush_if_due(self) -> None:
        """The minute's sums, one line per host and kind of news that came again."""
        now = self._clock()
        span = _window_due(self._window_start, now)
        if span is None:
            return
        for (host, kind, _), (n, line) in self._repeats.items():
            self._say(f"node {host} {kind} {n} more time{'s' * (n != 1)} in {span} (the "
                      f"newest: {line})")
        if self._unsaid:
            self._say(f"{self._unsaid} more comings and goings of nodes in {span} (too many "
                      f"to say each)")
        self._said.clear()
        self._reasons.clear()
        self._repeats.clear()
        self._lines = self._unsaid = 0
        self._window_start = now


def _window_due(start: float, now: float) -> str | None:
    """The window begun at `start` in words ("the last minute") once it has run its
    WINDOW_S, else None."""
    if now - start < WINDOW_S:
        return None
    minutes = (now - start) / 60
    return "the last minute" if minutes < 1.5 else f"the last {minutes:.0f} minutes"


def _host(address: str) -> str:
    return f"[{address}]" if ":" in address else address
