"""Which node sends each rank of the collector's copy, and when a rank passes to another.

A rank's frames are written into the copy by one node, its owner: the first host that
sent it, written down in RUN_DIR/owners.jsonl so that a collector started again on its
copy keeps the owners. Another host's frames for an owned rank are set aside (its other
ranks go on; said once per ranks and hosts), and the rank passes to that host, with one
line, when its owner is gone for it:
- the owner's connection ended RECONNECT_S ago and it has not come back (a node whose
  link failed, or the node itself; a collector started again counts its owners so from
  its start),
- or the owner is connected but has shown no sign of the rank running for LOST_S
  (lost.py's silence: its stream stalled, the rank's log closed, its heartbeat stopped),
- or the claim is of a newer launch of the job (the same elastic run, a higher restart
  count: torchrun restarted the ranks, on a replacement node).

What is believed, and why: a node's frames are its own word. The token proves a peer is
one of the job's nodes, a client certificate its host name; nothing on the wire proves
which ranks it runs. So a claim is believed by what the rank does in it: its log opened,
its log's head or heartbeat moving (a rank's heartbeat moves once a second while its
process lives), its digest position moving. A squatter that goes quiet, or repeats what it
sent, loses the ranks to the node where they run. Two claims that both move are a
conflict no frame settles: the owner keeps the ranks (moving them to and fro would mix
two hosts' events in one log), and the conflict is said and written as a finding that
names both hosts and the ranks, for a person to settle (who launched what, where). A
newer launch is believed at once (an elastic restart stops the old ranks before it starts
the new ones), though it too is the claimant's word: an old owner whose rank still moves
after it is the same conflict.

A moved rank's logs from its new owner are numbered after those in the copy already
(`base`): the old owner's copy (the crash of the node replaced) is kept whole.
"""

from __future__ import annotations

import json
import os
import time
from collections import OrderedDict

from distdoctor.collect.limits import MAX_LOG_NUMBER, MAX_RANKS, MAX_RANKS_PER_NODE
from distdoctor.collect.lost import LOST_S

OWNERS_FILE = "owners.jsonl"
# A forwarder whose connection broke is back within its first retries (forward.RETRY_S:
# 0.5 s, then 1 s): its ranks wait for it this long before another node may take them
RECONNECT_S = 2.0
MAX_PAIRS = 64  # pairs of hosts whose conflicts the finding names (ranks: a node's worth)
MAX_NEWS = 256  # lines waiting to be said (a few seconds' worth)
# A line waits until its ranks stop coming this long (or NEWS_WAIT_S at most): a node's
# ranks pass one by one, each on its own evidence, and are said in one line
NEWS_QUIET_S, NEWS_WAIT_S = 1.5, 5.0
MAX_SAID = 4096  # lines said already, remembered so each is said once
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


class Owners:
    """rank -> its owner's host, kept in RUN_DIR/owners.jsonl (a line per claim, move or
    release; rewritten whole when the moves make it twice what it holds)."""

    def __init__(self, run_dir):
        self.path = run_dir / OWNERS_FILE
        self.of: dict[int, str] = {}
        self.count: dict[str, int] = {}  # host -> ranks it owns
        self.base: dict[int, int] = {}  # a moved rank -> the copy's number of its log 0
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
                    self._give(host, ranks, base)

    def _take(self, host: str, ranks: list[int]) -> None:
        for r in ranks:
            if r not in self.of and len(self.of) < MAX_RANKS:
                self.of[r] = host
                self.count[host] = self.count.get(host, 0) + 1

    def _give(self, host: str, ranks: list[int], base: int) -> None:
        for r in ranks:
            old = self.of.get(r)
            if old is None and len(self.of) >= MAX_RANKS:
                continue
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
        """`old`'s ranks passed to `host`, its logs numbered from `bases[rank]` on."""
        by_base: dict[int, list[int]] = {}
        for r, base in bases.items():
            by_base.setdefault(base, []).append(r)
        for base, ranks in by_base.items():
            self._give(host, ranks, base)
            self._write({"host": host, "ranks": ranks, "base": base, "from": old})

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
        groups: dict[tuple[str, int], list[int]] = {}
        for r, host in self.of.items():
            groups.setdefault((host, self.base.get(r, 0)), []).append(r)
        text = "".join(json.dumps({"host": h, "ranks": rs, "base": b},
                                  separators=(",", ":")) + "\n"
                       for (h, b), rs in groups.items())
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


class Claims:
    """Mirror.claim's decisions and what they say (called under the Mirror's lock)."""

    def __init__(self, owners: Owners):
        self.owners = owners
        self.senders: dict[int, object] = {}  # rank -> the NodeMirror that sends it
        self.launched: dict[int, tuple] = {}  # rank -> its owner's newest incarnation
        self.started_s = time.monotonic()
        self.conflicts: OrderedDict[tuple[str, str], set[int]] = OrderedDict()
        self.conflicts_changed = False
        self._news: OrderedDict[tuple, list] = OrderedDict()  # -> [ranks, why, first, last]
        self._said: OrderedDict[tuple, None] = OrderedDict()

    def gone_why(self, owner: str, rank: int, now: float) -> str | None:
        """Why `owner` is gone for `rank` (its rank may pass on), None while it holds it."""
        node = self.senders.get(rank)
        if node is None or node.host != owner:  # an owner from owners.jsonl, not back yet
            gone = now - self.started_s
            return (f"not heard from since the collector started {gone:.0f} s ago"
                    if gone >= RECONNECT_S else None)
        if node.closed:
            gone = now - node.closed_s
            return f"its stream ended {gone:.0f} s ago" if gone >= RECONNECT_S else None
        seen = node.alive.get(rank)
        if seen is None:
            return "it sent no sign of the rank running"
        quiet = now - seen
        return f"no sign of the rank running for {quiet:.0f} s" if quiet >= LOST_S else None

    def moving(self, owner: str, rank: int, now: float) -> bool:
        """Whether `owner`'s stream moved `rank` (head, heartbeat, digest clock) of late."""
        node = self.senders.get(rank)
        return (node is not None and node.host == owner and not node.closed
                and now - node.moving.get(rank, now - LOST_S) < LOST_S)

    def note(self, what: str, old: str, new: str, ranks, why: str = "") -> None:
        """News for the next say(): `what` is aside or moved."""
        key, now = (what, old, new), time.monotonic()
        entry = self._news.get(key)
        if entry is None:
            if len(self._news) >= MAX_NEWS:
                return
            entry = self._news[key] = [set(), why, now, now]
        if len(entry[0]) < MAX_RANKS_PER_NODE and not entry[0].issuperset(ranks):
            entry[0].update(ranks)
            entry[3] = now

    def conflict(self, owner: str, other: str, rank: int) -> None:
        ranks = self.conflicts.get((owner, other))
        if ranks is None:
            if len(self.conflicts) >= MAX_PAIRS:
                return
            ranks = self.conflicts[(owner, other)] = set()
        if rank not in ranks and len(ranks) < MAX_RANKS_PER_NODE:
            ranks.add(rank)
            self.conflicts_changed = True  # (said as the finding is: the viewer prints it)

    def lines(self) -> list[str]:
        """The news whose ranks stopped coming, one line per what, hosts and ranks (said
        once)."""
        from distdoctor.diagnosis.report import rank_ranges

        out, now = [], time.monotonic()
        for key, (ranks, why, first, last) in list(self._news.items()):
            if now - last < NEWS_QUIET_S and now - first < NEWS_WAIT_S:
                continue
            del self._news[key]
            what, old, new = key
            text = rank_ranges(ranks)
            if (what, old, new, text) in self._said:
                continue
            self._said[(what, old, new, text)] = None
            while len(self._said) > MAX_SAID:
                self._said.popitem(last=False)
            s = "s" if len(ranks) > 1 else ""
            if what == "moved":
                out.append(f"rank{s} {text} moved from node {old} to node {new} ({old}: "
                           f"{why})")
            else:
                them = "them" if s else "it"
                out.append(f"node {new} sends rank{s} {text} of node {old}: its frames for "
                           f"{them} are set aside while node {old} runs {them} (said once)")
        return out

    def findings(self) -> list:
        from distdoctor.findings import Finding

        self.conflicts_changed = False
        return [Finding("host", "warning", conflict_summary(owner, other, ranks),
                        sorted(ranks), details={"reason": "rank_conflict",
                                                "hosts": [owner, other], "kept": owner},
                        remedy=CONFLICT_REMEDY)
                for (owner, other), ranks in self.conflicts.items()]


CONFLICT_REMEDY = ("Two nodes send the same ranks and both show them running: one of "
                   "them was given the wrong rank numbers (its --node-rank, RANK or "
                   "launcher's host list), or is not a node of this job. Check which host "
                   "runs these ranks (the job's launcher or rendezvous says), and stop "
                   "the other's `distdoctor run --forward`.")


def conflict_summary(owner: str, other: str, ranks) -> str:
    from distdoctor.diagnosis.report import rank_ranges

    s = "s" if len(ranks) > 1 else ""
    return (f"rank conflict: node {owner} and node {other} both send rank{s} "
            f"{rank_ranges(ranks)} and both show {'them' if s else 'it'} running; the "
            f"copy keeps node {owner}'s (it had {'them' if s else 'it'} first), node "
            f"{other}'s are set aside")
