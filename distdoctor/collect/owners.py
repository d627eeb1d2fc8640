"""Which node sends each rank of the collector's copy (the records; when a rank may pass to
another node is claims.py's to decide).

A rank's frames are written into the copy by one node, its owner: the first host that
sent it, written down in RUN_DIR/owners.jsonl so that a collector started again on its
copy keeps the owners, with each move (the new owner, the number its logs start at in the
copy, the former owner and how many of its logs are the rank's past) and each release.

A moved rank's logs from its new owner are numbered after those in the copy already
(`base`): the old owner's copy (the crash of the node replaced) is kept whole. A former
owner's logs of the rank ("past") are the rank's past whenever they are sent again, never
a claim. A log whose claim was disproven (claims.py) is moved out of ranks/ into
RUN_DIR/set-aside/ (set_aside.py): its number stays taken, so no later log reuses a name
a reader of the copy has seen (a rank given back numbers its later logs after it: `jump`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from distdoctor.collect.limits import MAX_LOG_NUMBER, MAX_RANKS
from distdoctor.runlog.rundir import parse_log_name

OWNERS_FILE = "owners.jsonl"
ASIDE_DIR = "set-aside"  # logs whose claim was disproven, out of the readers' ranks/
# A forwarder whose connection broke is back within its first retries (forward.RETRY_S:
# 0.5 s, then 1 s): its ranks wait for it this long before another node may take them
RECONNECT_S = 2.0
MAX_FORMERS = 4  # a rank's former owners whose old logs are known as such (stale)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


class Owners:
    """rank -> its owner's host, kept in RUN_DIR/owners.jsonl (a line per claim, move or
    release; rewritten whole when the moves make it twice what it holds)."""

    def __init__(self, run_dir):
        self.path = run_dir / OWNERS_FILE
        self.of: dict[int, str] = {}
        self.count: dict[str, int] = {}  # host -> ranks it owns
        self.base: dict[int, int] = {}  # a moved rank -> the copy's number of its log 0
        # a rank given back over the logs of a claim shown false -> (its owner's first log
        # after them, that log's number): numbers a reader has seen are never reused
        self.jump: dict[int, tuple[int, int]] = {}
        self.run_dir = run_dir
        self._top = _files_past(run_dir)  # rank -> past its newest file in the copy
        self.past: dict[int, dict[str, int]] = {}  # rank -> its former owners' old logs (stale)
        self._lines = 0
        self._load()

    def _load(self) -> None:
        """The owners a collector before us wrote (lines it cut short are skipped)."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC | _NOFOLLOW)
        except OSError:
            return
        with os.fdopen(fd, "rb") as f:
            for line in f:
                self._lines += 1
                try:
                    item = json.loads(line)
                    host, ranks, base = item["host"], item.get("ranks"), item.get("base")
                    old, past, jump = item.get("from"), item.get("past"), item.get("jump")
                except (ValueError, KeyError, TypeError, AttributeError):
                    continue
                if not isinstance(host, str):
                    continue
                if item.get("released") is True:
                    self._release(host)
                    continue
                if not isinstance(ranks, list):
                    continue
                ranks = [r for r in ranks if type(r) is int and r >= 0]
                if base is None:
                    self._take(host, ranks)
                elif type(base) is int and 0 <= base <= MAX_LOG_NUMBER:
                    sound = isinstance(old, str) and type(past) is int \
                        and 0 <= past <= MAX_LOG_NUMBER
                    self._give(host, ranks, base, *((old, past) if sound else ()))
                    if isinstance(jump, list) and len(jump) == 2 and all(
                            type(n) is int and 0 <= n <= MAX_LOG_NUMBER for n in jump):
                        self.jump.update((r, tuple(jump)) for r in ranks if r in self.of)

    def _take(self, host: str, ranks: list[int]) -> None:
        for r in ranks:
            if r not in self.of and len(self.of) < MAX_RANKS:
                self.of[r] = host
                self.count[host] = self.count.get(host, 0) + 1

    def _give(self, host: str, ranks: list[int], base: int, former: str | None = None,
              past: int = 0) -> None:
        for r in ranks:
            old = self.of.get(r)
            if old is None and len(self.of) >= MAX_RANKS:
                continue
            self.past.get(r, {}).pop(host, None)  # (its own now)
            self.jump.pop(r, None)
            if former is not None and former != host:
                formers = self.past.setdefault(r, {})
                formers.pop(former, None)
                formers[former] = past
                while len(formers) > MAX_FORMERS:
                    del formers[next(iter(formers))]
            if old is not None:
                self._uncount(old)
            self.of[r] = host
            self.count[host] = self.count.get(host, 0) + 1
            if base:
                self.base[r] = base
            else:
                self.base.pop(r, None)

    def _uncount(self, host: str) -> None:
        n = self.count.get(host, 0) - 1
        if n > 0:
            self.count[host] = n
        else:
            self.count.pop(host, None)

    def claim(self, host: str, ranks: list[int]) -> None:
        """Give `host` the ranks it is the first to send, and write them down."""
        new = [r for r in dict.fromkeys(ranks) if r not in self.of]
        if new:
            self._take(host, new)
            self._write({"host": host, "ranks": new})

    def move(self, host: str, bases: dict[int, int], old: str) -> None:
        """`old`'s ranks passed to `host`, its logs numbered from `bases[rank]` on; `old`'s
        logs of them so far ("past": those numbered below it) are the rank's past."""
        groups: dict[tuple[int, int], list[int]] = {}
        for r, base in bases.items():
            groups.setdefault((base, max(0, self._log_of(r, base))), []).append(r)
        for (base, past), ranks in groups.items():
            self._give(host, ranks, base, old, past)
            self._write({"host": host, "ranks": ranks, "base": base, "from": old,
                         "past": past})

    def stale(self, host: str, rank: int, log: int | None) -> bool:
        """Whether `host`'s log `log` of `rank` is one it sent before the rank passed from
        it to another node: a log of the rank's past, sent again (a reconnection, a
        collector started again), never a claim of the rank now. A node whose rank was
        restarted elsewhere keeps its old log (not closed when the rank was killed) and
        sends it whenever it connects: it took the rank back whenever the owner had not
        reconnected yet (a collector's restart: forwarders come back over up to 30 s)."""
        return log is not None and log < self.past.get(rank, {}).get(host, 0)

    def give_back(self, host: str, rank: int, base: int, taker: str, first: int) -> None:
        """`rank` is `host`'s again, its logs numbered from `base` as before `taker` took
        it at the copy's number `first` (claims.py: a launch shown false), and its later
        logs after every number `taker`'s took; every log `taker` sent of it so far is
        the rank's past."""
        top = self.next_log(rank)
        past = max(0, self._log_of(rank, top))
        self._give(host, [rank], base, taker, past)
        jump = [first - base, top]
        if top > first:
            self.jump[rank] = (jump[0], top)
        self._write({"host": host, "ranks": [rank], "base": base, "from": taker,
                     "past": past, **({"jump": jump} if top > first else {})})

    def number(self, rank: int, log: int) -> int:
        """The copy's number of the owner's log `log` of `rank`."""
        jump = self.jump.get(rank)
        if jump is not None and log >= jump[0]:
            return jump[1] + log - jump[0]
        return self.base.get(rank, 0) + log

    def _log_of(self, rank: int, number: int) -> int:
        """The owner's log whose copy `number` is (number's inverse, where one is)."""
        jump = self.jump.get(rank)
        if jump is not None and number >= jump[1]:
            return jump[0] + number - jump[1]
        return number - self.base.get(rank, 0)

    def newest(self, rank: int) -> int:
        """The copy's number of the newest log of `rank` its owner sent: where the owner
        got the rank back over a claim shown false and sent no log since (jump), the
        newest numbers are that claim's, in set-aside/, and its own come before them."""
        top, jump = self.next_log(rank) - 1, self.jump.get(rank)
        if jump is not None and top < jump[1]:
            top = self.base.get(rank, 0) + jump[0] - 1
        return max(0, top)

    def next_log(self, rank: int) -> int:
        """A log number of `rank` past every file of it in the copy (a moved rank's new
        owner numbers its logs from there: the old owner's copies stay whole): past the
        files listed at the start (_files_past) and those made since, never a stat."""
        return max(self.base.get(rank, 0), self._top.get(rank, 0))

    def made(self, rank: int, n: int) -> None:
        """The copy has a file of `rank`'s log `n`."""
        if n >= self._top.get(rank, 0):
            self._top[rank] = n + 1

    def release(self, host: str) -> list[int]:
        """`host`'s ranks set free (shares.py: let go to make room), and written down."""
        ranks = self._release(host)
        self._write({"host": host, "released": True})
        return ranks

    def _release(self, host: str) -> list[int]:
        ranks = [r for r, h in self.of.items() if h == host]
        for r in ranks:
            del self.of[r]
            self.base.pop(r, None)
            self.jump.pop(r, None)
            self.past.pop(r, None)
        self.count.pop(host, None)
        return ranks

    def _write(self, item: dict) -> None:
        line = json.dumps(item, separators=(",", ":")) + "\n"
        self._lines += 1
        if self._lines > 2 * len(self.of) + 1024:  # moves to and fro: the file stays bounded
            return self._rewrite()
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
                         | _NOFOLLOW, 0o644)
        except OSError:
            return  # (kept in memory: only a collector started again would miss them)
        try:
            os.write(fd, line.encode())
        except OSError:
            pass
        finally:
            os.close(fd)

    def _rewrite(self) -> None:
        """The file made anew from what it holds now, put in place whole."""
        groups: dict[tuple, list[int]] = {}
        for r, host in self.of.items():
            for former in [None, *self.past.get(r, {}).items()]:
                groups.setdefault((host, self.base.get(r, 0), former, self.jump.get(r)),
                                  []).append(r)
        text = "".join(json.dumps({"host": h, "ranks": rs, "base": b, **(
            {"from": f[0], "past": f[1]} if f else {}), **({"jump": list(j)} if j else {})},
            separators=(",", ":")) + "\n" for (h, b, f, j), rs in groups.items())
        temp = self.path.with_name(f".{OWNERS_FILE}.{os.getpid()}")
        try:
            fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC
                         | _NOFOLLOW, 0o644)
            with os.fdopen(fd, "w") as f:
                f.write(text)
            os.replace(temp, self.path)
            self._lines = len(groups)
        except OSError:
            pass


def _files_past(run_dir: Path) -> dict[int, int]:
    """rank -> past the highest number of its files in the copy (ranks/, set-aside/), as
    a collector before us left them. Listed, not counted up from 0: the numbers may have
    gaps (a node's logs sent from its newest after a reconnection, a peer's log 7 alone),
    and a new owner numbered from the first gap wrote its logs over an old owner's."""
    top: dict[int, int] = {}
    for folder in ("ranks", ASIDE_DIR):
        try:  # (listed through a descriptor: no link followed to another dir's names)
            fd = os.open(run_dir / folder, os.O_RDONLY | os.O_DIRECTORY | _NOFOLLOW
                         | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            names = os.listdir(fd)
        except OSError:
            continue
        finally:
            os.close(fd)
        for parsed in map(parse_log_name, names):
            if parsed is not None and parsed[1] < MAX_LOG_NUMBER:
                top[parsed[0]] = max(top.get(parsed[0], 0), parsed[1] + 1)
    return top


def incarnation(launch) -> tuple[str, int] | None:
    """(elastic run id, restart count) of a log's launch identity (tracer.install's
    launch_identity), None where it has none."""
    if not isinstance(launch, dict):
        return None
    run, count = launch.get("torchelastic_run_id"), launch.get("torchelastic_restart_count")
    try:
        count = int(str(count)[:20])
    except ValueError:
        return None
    return (run, count) if isinstance(run, str) and 0 <= count < 1 << 63 else None


def newer(claim: tuple | None, held: tuple | None) -> bool:
    """Whether a claim's launch is a later restart of the same elastic run than the one
    its owner sends."""
    return claim is not None and held is not None and claim[0] == held[0] \
        and claim[1] > held[1]
