"""Who may write a rank of the collector's copy now (Mirror.claim's decisions, over the
records of owners.py), and what is said of it.

Another host's frames for an owned rank are set aside (its other ranks go on; said once
per ranks and hosts), and the rank passes to that host, with one line, when its owner is
gone for it:
- the owner's connection ended RECONNECT_S ago and it has not come back (a node whose
  link failed, or the node itself; a collector started again counts its owners so from
  its start),
- or the owner is connected but has shown no sign of the rank running for LOST_S
  (lost.py's silence: its stream stalled, the rank's log closed, its heartbeat stopped),
- or the claim is of a newer launch of the job (the same elastic run, a higher restart
  count: torchrun restarted the ranks, on a replacement node).
A rank its owner finished (its exit code came: copy_exits.py) is not gone while its
owner is connected (its silence is its exit's): a claim of its elastic run takes it once
that run has restarted since as more than one host shows it (restarts.py: torchrun's
agents count restarts each on its own, a replacement node's fresh agent from 0 while the
others count on; one host's number, newer or not, is its word alone, and nothing shows
it false later as a running rank's owner does by running on), or any claim once the
owner's stream has ended. The last is a re-run of the job on a spare host under the same
launch identity (static torchrun, `run --nproc`), which the wire cannot tell from a node
that claims ranks not its own: a real node's ranks set aside for good lose its whole run;
a false claim takes the rank, and the owner's exit entry is kept (copy_exits.py).

What is believed, and why: a node's frames are its own word. The token proves a peer is
one of the job's nodes, a client certificate its host name; nothing on the wire proves
which ranks it runs. So a claim is believed by what the rank does in it: its log opened,
its log's head or heartbeat moving (a rank's heartbeat moves once a second while its
process lives), its digest position moving. A squatter that goes quiet, or repeats what it
sent, loses the ranks to the node where they run; if its logs never showed them running
at all (no event, no close, no move in LOST_S of its stream), they were no rank's: they go
out of the copy's ranks/ (set-aside/), so no reader takes them for a rank that died. Two claims that
move together for OVERLAP_S are a conflict no frame settles (a rank stopped on one host
and started on another moved on both within seconds, never at once): the owner keeps the
ranks, and the conflict is said and written as a finding that names both hosts and the
ranks, for a person to settle (who launched what, where).

A newer launch of a running rank is believed at once, by one restart at most past what
the run's hosts show (restarts.py; an elastic restart stops the old ranks before it
starts the new ones; a log's META, sent before its OPEN, waits for it), though it too is
the claimant's word. The restart it claims stops the rank it replaces: a former owner
that ran the rank without a break from before that launch until the conflict is proven
(or until the claimant is gone for it: one that sent the launch and left) shows the
launch false (forged, or a node that does not know its own rank numbers), so
the rank goes back to it as it was (its logs' numbers), the claimant's logs of it go to
set-aside/, and no launch takes that rank at once again (a real restart still takes it
once the rank stops where it ran: gone for LOST_S). A former owner whose rank fell quiet
across the launch and moves again is no proof either way: the launch keeps the rank, and
the finding says which is shown and why.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass

from distdoctor.collect.limits import MAX_RANKS_PER_NODE
from distdoctor.collect.lost import LOST_S
from distdoctor.collect.owners import RECONNECT_S, Owners, newer
from distdoctor.collect.restarts import RunCounts
from distdoctor.runlog.rundir import ring_path

# Two runs of a rank's moves, on two nodes, that overlap this long are a conflict: longer
# than a slow node's stream lags behind another's (its forwarder's passes, a backlog)
OVERLAP_S = LOST_S
MAX_PAIRS = 64  # pairs of hosts whose conflicts the finding names (ranks: a node's worth)
MAX_NEWS = 256  # lines waiting to be said (a few seconds' worth)
# A line waits until its ranks stop coming this long (or NEWS_WAIT_S at most): a node's
# ranks pass one by one, each on its own evidence, and are said in one line
NEWS_QUIET_S, NEWS_WAIT_S = 1.5, 5.0
MAX_SAID = 4096  # lines said already, remembered so each is said once
BY_LAUNCH = "it sends an older launch of the job"  # why a rank passed at once
# why a rank passed back (from the host whose launch took it)
RAN_ON = "its newer launch is its word alone: node {} ran the rank on without a break"
FIRST, LAUNCH, KEPT_ON = "first", "launch", "kept_on"  # how the shown host holds a conflict


@dataclass
class Taken:
    """How a rank's owner took it by a newer launch: from whom, when, what the former
    owner had (its launch, its logs' base in the copy) to give back, and the copy's
    number of the first log of the launch (those from there on are the launch's)."""

    former: str
    at_s: float
    launch: tuple | None
    base: int
    first: int


class Claims:
    """Mirror.claim's decisions and what they say (called under the Mirror's lock)."""

    def __init__(self, owners: Owners, exits):
        self.owners, self.exits = owners, exits  # (copy_exits.CopyExits: finished ranks)
        self.senders: dict[int, object] = {}  # rank -> the NodeMirror that sends it
        self.launched: dict[int, tuple] = {}  # rank -> its owner's newest incarnation
        self.by_launch: dict[int, Taken] = {}  # ranks their owner took by a newer launch
        self.doubted: set[int] = set()  # ranks a launch was shown false for (no more at once)
        self.counts = RunCounts(owners.count)  # elastic run -> its hosts' restart counts
        self.started_s = time.monotonic()
        # (host shown, other host) -> the ranks, and how the shown one holds them
        self.conflicts: OrderedDict[tuple[str, str], set[int]] = OrderedDict()
        self.how: dict[tuple[str, str], str] = {}
        self.conflicts_changed = False
        self._news: OrderedDict[tuple, list] = OrderedDict()  # -> [ranks, why, first, last]
        self._said: OrderedDict[tuple, None] = OrderedDict()

    def why(self, host: str, owner: str, rank: int, launch: tuple | None,
            now: float) -> str | None:
        """Why `host`'s claim of `owner`'s `rank` (a log of `launch`) takes it now; None:
        set aside. A finished rank is silent: gone only once its owner left, or relaunched."""
        finished = self.exits.finished(rank)
        if finished and rank not in self.launched:  # (a collector before us's)
            self.granted(owner, rank, self.exits.launch_of(rank, ring_path(
                self.owners.run_dir, rank, self.owners.newest(rank))))
        if finished and not self.relaunched(host, launch, rank):
            return self.left_why(owner, rank, now)
        return self.launch_why(host, launch, rank) or self.gone_why(owner, rank, now)

    def launch_why(self, host: str, launch: tuple | None, rank: int) -> str | None:
        """BY_LAUNCH where `host`'s claim's launch (its count as restarts.py bounds it)
        passes `rank` at once."""
        return BY_LAUNCH if rank not in self.doubted and newer(
            self.counts.bounded(host, launch), self.launched.get(rank)) else None

    def relaunched(self, host: str, launch: tuple | None, rank: int) -> bool:
        """Whether `host`'s claim is of the elastic run `rank`'s owner launched it in, and
        more than one host shows that run restarted since (restarts.py)."""
        held = self.launched.get(rank)
        if launch is None or held is None or launch[0] != held[0]:
            return False
        borne = self.counts.borne(held[0], host, launch[1])
        return borne is not None and borne > held[1]

    def granted(self, host: str, rank: int, launch: tuple | None) -> None:
        """`rank` is written from `host`'s log of `launch` (owners.incarnation) now: its
        count as restarts.py bounds it, never back to an older one."""
        self.counts.add(host, launch)
        launch = self.counts.bounded(host, launch)
        if launch is None or newer(self.launched.get(rank), launch):
            return
        self.launched[rank] = launch

    def left_why(self, owner: str, rank: int, now: float) -> str | None:
        """Why `owner` is gone for `rank` by its connection: its stream ended RECONNECT_S
        ago, or it is not back since the collector started; None while connected."""
        node = self.senders.get(rank)
        if node is None or node.host != owner:  # an owner from owners.jsonl, not back yet
            gone = now - self.started_s
            return (f"not heard from since the collector started {gone:.0f} s ago"
                    if gone >= RECONNECT_S else None)
        if node.closed:
            gone = now - node.closed_s
            return f"its stream ended {gone:.0f} s ago" if gone >= RECONNECT_S else None
        return None

    def gone_why(self, owner: str, rank: int, now: float) -> str | None:
        """Why `owner` is gone for `rank` (its rank may pass on), None while it holds it:
        its connection (left_why), or no sign of the rank running for LOST_S."""
        node = self.senders.get(rank)
        if node is None or node.host != owner or node.closed:
            return self.left_why(owner, rank, now)
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

    def ran_through(self, node, rank: int) -> Taken | None:
        """The launch that took `rank` from `node` (a NodeMirror) where `node` has moved
        the rank without a break (no LOST_S without a move) since before it: a restart
        stops the rank it replaces, so that launch was its sender's word alone."""
        taken = self.by_launch.get(rank)
        if taken is None or taken.former != node.host:
            return None
        since = node.since.get(rank)
        return taken if since is not None and since < taken.at_s else None

    def took(self, ranks, why: str, former: str, bases: dict[int, int], to: dict[int, int],
             now: float) -> None:
        """`ranks` passed from `former` (whose logs of them started at `bases`; the new
        owner's start at `to`) for `why`. A launch taken from an owner that took it by a
        launch itself keeps the first: the node that ran the rank before both."""
        for r in ranks:
            if why != BY_LAUNCH:
                self.by_launch.pop(r, None)
            elif r not in self.by_launch:
                self.by_launch[r] = Taken(former, now, self.launched.get(r), bases.get(r, 0),
                                          to[r])

    def gave_back(self, rank: int, taken: Taken) -> None:
        """`rank` went back to the owner its launch was taken from: no launch believed
        at once for it any more. (Its taker's count stays its own word: one host's
        count moves no run on, restarts.py.)"""
        self.by_launch.pop(rank, None)
        self.doubted.add(rank)
        self.launched.pop(rank, None)
        if taken.launch is not None:
            self.launched[rank] = taken.launch

    def forget(self, ranks) -> None:
        """Ranks set free (shares.py)."""
        for r in ranks:
            self.senders.pop(r, None)
            self.launched.pop(r, None)
            self.by_launch.pop(r, None)
            self.doubted.discard(r)

    def note(self, what: str, old: str, new: str, ranks, why: str = "") -> None:
        """News for the next say(): `what` is aside, finished (set aside: its owner
        finished it) or moved."""
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

    def conflict(self, shown: str, other: str, rank: int) -> None:
        """`shown` (the owner) and `other` both run `rank`: how `shown` holds it is said
        (FIRST, LAUNCH; KEPT_ON: it got it back, ran_through)."""
        how = self.how.get((shown, other)) or (LAUNCH if rank in self.by_launch else FIRST)
        self._conflict(shown, other, rank, how)

    def kept_on(self, shown: str, other: str, rank: int) -> None:
        """`shown` got `rank` back from `other`'s launch (ran_through)."""
        self._conflict(shown, other, rank, KEPT_ON)
        ranks = self.conflicts.get((other, shown))
        if ranks is not None and rank in ranks:  # (said while the launch held it)
            ranks.discard(rank)
            if not ranks:
                del self.conflicts[(other, shown)]
                self.how.pop((other, shown), None)

    def _conflict(self, shown: str, other: str, rank: int, how: str) -> None:
        ranks = self.conflicts.get((shown, other))
        if ranks is None:
            if len(self.conflicts) >= MAX_PAIRS:
                return
            ranks = self.conflicts[(shown, other)] = set()
        if self.how.get((shown, other)) != how:
            self.how[(shown, other)] = how
            self.conflicts_changed = True
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
            them = "them" if s else "it"
            if what == "moved":
                out.append(f"rank{s} {text} moved from node {old} to node {new} ({old}: "
                           f"{why})")
            elif what == "finished":
                out.append(f"node {new} sends rank{s} {text} of node {old}: its frames for "
                           f"{them} are set aside: node {old} finished {them} (its exit "
                           f"codes came); {them} pass once node {old} has left, or to a "
                           f"restart of the job that more than one node shows (said once)")
            else:
                out.append(f"node {new} sends rank{s} {text} of node {old}: its frames for "
                           f"{them} are set aside while node {old} runs {them} (said once)")
        return out

    def findings(self) -> list:
        from distdoctor.findings import Finding

        self.conflicts_changed = False
        return [Finding("host", "warning", conflict_summary(
                            shown, other, ranks, self.how.get((shown, other), FIRST)),
                        sorted(ranks), details={"reason": "rank_conflict",
                                                "hosts": [shown, other], "kept": shown},
                        remedy=CONFLICT_REMEDY)
                for (shown, other), ranks in self.conflicts.items() if ranks]


CONFLICT_REMEDY = ("Two nodes send the same ranks and both show them running: one of "
                   "them was given the wrong rank numbers (its --node-rank, RANK or "
                   "launcher's host list), or is not a node of this job. Check which host "
                   "runs these ranks (the job's launcher or rendezvous says), and stop "
                   "the other's `distdoctor run --forward`.")


def conflict_summary(shown: str, other: str, ranks, how: str = FIRST) -> str:
    """`how` the copy came to show `shown`'s: FIRST (it had them first), LAUNCH (it took
    them from `other` by a newer launch, which `other` goes on running: which of them
    runs the rank cannot be told from their streams), KEPT_ON (it ran them without a
    break through `other`'s newer launch: that launch was `other`'s word alone)."""
    from distdoctor.diagnosis.report import rank_ranges

    s = "s" if len(ranks) > 1 else ""
    them = "them" if s else "it"
    how = {LAUNCH: f"it sent a newer launch of the job, node {other} runs {them} on",
           KEPT_ON: f"it ran {them} without a break through node {other}'s newer launch of "
                    f"the job, which is node {other}'s word alone: node {other}'s are set "
                    f"aside"}.get(how, f"it had {them} first, node {other}'s are set aside")
    return (f"rank conflict: node {shown} and node {other} both send rank{s} "
            f"{rank_ranges(ranks)} and both show {them} running; the copy shows node "
            f"{shown}'s ({how})")
