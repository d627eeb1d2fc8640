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
sent, loses the ranks to the node where they run. Two claims that move together for
OVERLAP_S are a conflict no frame settles (a rank stopped on one host and started on
another moved on both within seconds, never at once): the owner keeps the ranks, and the
conflict is said and written as a finding that names both hosts and the ranks, for a
person to settle (who launched what, where). A newer launch is believed at once (an
elastic restart stops the old ranks before it starts the new ones; a log's META, sent
before its OPEN, waits for it), though it too is the claimant's word: an old owner whose
rank still moves after it is the same conflict. A former owner's logs of the rank
("past") are the rank's past whenever they are sent again, never a claim.

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
from distdoctor.runlog.rundir import rank_meta_path, ring_path

OWNERS_FILE = "owners.jsonl"
# A forwarder whose connection broke is back within its first retries (forward.RETRY_S:
# 0.5 s, then 1 s): its ranks wait for it this long before another node may take them
RECONNECT_S = 2.0
# Two runs of a rank's moves, on two nodes, that overlap this long are a conflict: longer
# than a slow node's stream lags behind another's (its forwarder's passes, a backlog)
OVERLAP_S = LOST_S
MAX_FORMERS = 4  # a rank's former owners whose old logs are known as such (stale)
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
        self.run_dir = run_dir
        self._top: dict[int, int] = {}  # rank -> past its newest log in the copy (next_log)
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
                    old, past = item.get("from"), item.get("past")
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
            groups.setdefault((base, max(0, base - self.base.get(r, 0))), []).append(r)
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

    def next_log(self, rank: int) -> int:
        """A log number of `rank` past every file of it in the copy (a moved rank's new
        owner numbers its logs from there: the old owner's copies stay whole). Read from
        the disk once a rank, from its owner's base on, then kept (made): a scan from 0
        each move cost a stat per log the copy has of the rank, so a peer moving a rank to
        and fro (2 hosts, forged launches) made each move slower than the last, on the
        collector's event loop."""
        n = self._top.get(rank)
        if n is None:
            n = self.base.get(rank, 0)
            while n < MAX_LOG_NUMBER and (ring_path(self.run_dir, rank, n).exists()
                                          or rank_meta_path(self.run_dir, rank, n).exists()):
                n += 1
        self._top[rank] = n
        return n

    def made(self, rank: int, n: int) -> None:
        """The copy has a file of `rank`'s log `n` (kept once next_log has read the disk
        for the rank: before, files a collector before us made may lie past `n`)."""
        if n >= self._top.get(rank, MAX_LOG_NUMBER + 1):
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
            self._top.pop(r, None)
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
                groups.setdefault((host, self.base.get(r, 0), former), []).append(r)
        text = "".join(json.dumps({"host": h, "ranks": rs, "base": b, **(
            {"from": f[0], "past": f[1]} if f else {})}, separators=(",", ":")) + "\n"
                       for (h, b, f), rs in groups.items())
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
        self.by_launch: set[int] = set()  # ranks their owner took by a newer launch
        self.launch_pairs: set[tuple[str, str]] = set()  # conflicts of such an owner
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

    def both_run(self, owner: str, other, rank: int, now: float) -> bool:
        """Whether `owner`'s stream and `other` (a NodeMirror) both move `rank` (head,
        heartbeat, digest clock) now, and have for OVERLAP_S together. A rank handed over
        (stopped on one host, started on another: a replacement, a relaunch) moved on both
        within LOST_S but never at once, but for the lag between the two streams; two
        nodes that both run it go on moving it together."""
        node = self.senders.get(rank)
        if node is None or node.host != owner or node.closed:
            return False
        runs = [(n.since.get(rank), n.moving.get(rank)) for n in (node, other)]
        if any(last is None or first is None or now - last >= LOST_S for first, last in runs):
            return False
        return min(last for _, last in runs) - max(first for first, _ in runs) >= OVERLAP_S

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

    def retract(self, host: str, ranks) -> None:
        """`host`'s ranks passed to it before their set-aside line was said (a META held
        for its OPEN, a claim whose owner went): not said."""
        for key in [k for k in self._news if k[0] == "aside" and k[2] == host]:
            self._news[key][0].difference_update(ranks)
            if not self._news[key][0]:
                del self._news[key]

    def conflict(self, owner: str, other: str, rank: int) -> None:
        ranks = self.conflicts.get((owner, other))
        if ranks is None:
            if len(self.conflicts) >= MAX_PAIRS:
                return
            ranks = self.conflicts[(owner, other)] = set()
            if rank in self.by_launch:  # (the summary says how the owner came to hold it)
                self.launch_pairs.add((owner, other))
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
        return [Finding("host", "warning", conflict_summary(
                            owner, other, ranks, (owner, other) in self.launch_pairs),
                        sorted(ranks), details={"reason": "rank_conflict",
                                                "hosts": [owner, other], "kept": owner},
                        remedy=CONFLICT_REMEDY)
                for (owner, other), ranks in self.conflicts.items()]


CONFLICT_REMEDY = ("Two nodes send the same ranks and both show them running: one of "
                   "them was given the wrong rank numbers (its --node-rank, RANK or "
                   "launcher's host list), or is not a node of this job. Check which host "
                   "runs these ranks (the job's launcher or rendezvous says), and stop "
                   "the other's `distdoctor run --forward`.")


def conflict_summary(owner: str, other: str, ranks, by_launch: bool = False) -> str:
    """`by_launch`: the owner took the ranks from `other` by a newer launch, which `other`
    goes on running: that launch is the word in doubt (it had them first, said before)."""
    from distdoctor.diagnosis.report import rank_ranges

    s = "s" if len(ranks) > 1 else ""
    them = "them" if s else "it"
    how = (f"it sent a newer launch of the job, node {other} runs {them} on"
           if by_launch else f"it had {them} first, node {other}'s are set aside")
    return (f"rank conflict: node {owner} and node {other} both send rank{s} "
            f"{rank_ranges(ranks)} and both show {them} running; the copy shows node "
            f"{owner}'s ({how})")
