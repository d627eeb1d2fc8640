"""Follow a run directory while the job writes it: new events, completions, heartbeats.

An op is written once when it enters (in flight) and its slot is updated in place when it
completes, so a follower re-reads the slots of the ops it last saw in flight. Rank logs
that appear later (a launcher starting ranks one by one, a rank that starts again) are
picked up on the next poll, each in its incarnation (runlog.incarnations). A log that is
finished (closed, or left behind by a newer log of its rank) and fully read is let go, so
a job that re-launches its ranks a thousand times holds a few files open, not thousands.
Past `open_logs_budget()` logs followed at once (a quarter of the open-files limit: a
collector's copy of hundreds of ranks under `ulimit -n 1024`), the logs beyond it are
closed after each read and opened again for the next (RankLog.park).

What ranks put in the run dir is untrusted, and a poll reads every rank's files: one file
that cannot be read (a FIFO or a link at its name, a log whose strings are corrupt,
metadata nested 100,000 deep) costs that file, said once, never the poll nor the other
ranks' events (runlog.reader, rundir.rank_meta_at).
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from distdoctor.errors import UserError
from distdoctor.runlog.incarnations import Incarnations
from distdoctor.runlog.interleave import interleaved
from distdoctor.runlog.pace import Pace
from distdoctor.runlog.reader import Event, NotALog, RankLog, RingHeader
from distdoctor.runlog.rundir import parse_log_name, rank_meta_at, rank_meta_path, rank_stem
from distdoctor.runlog.values import READ_SLOTS

# In-flight ops re-read per rank per poll, at most: async work that never reports its
# completion must not make every poll slower.
MAX_PENDING = 4096
RESCAN_S = 2.0  # the ranks folder is listed at least this often (see _discover)
META_RETRY_S = 0.25  # first retry of a rank's missing metadata; doubles up to RESCAN_S
RETIRE_S = 5.0  # a log left behind by a newer one of its rank, quiet this long, is let go
FIRST_PIECE = 64  # slots of a poll's first read; each next piece 8 times more, to READ_SLOTS


@dataclass
class RankFeed:
    log: RankLog
    incarnation: int = 0
    next_index: int = 0
    pending: dict[int, None] = field(default_factory=dict)  # in-flight event numbers, ordered
    header: RingHeader | None = None
    stalls: int = 0  # polls for which slot `next_index` stayed unreadable

    def read_new(self) -> list[Event]:
        """Events from `next_index` on; stops at a slot still being written.

        A slot whose number does not match yet is retried on the next poll rather than
        skipped (a skipped arrival would look like a rank that never joined); one that
        stays unreadable for a few polls is corrupt, and skipped.
        """
        head = self.header.head
        index = max(self.next_index, head - self.log.capacity, 0)
        out = []
        piece, stalled = FIRST_PIECE, False
        # in pieces, stopping at the first slot still being written: what a poll reads
        # follows what was written since the last, whatever the header claims
        while index < head and not stalled:
            evs = self.log.read_range(index, min(head, index + piece))
            at = 0
            while at < len(evs):  # by stretches between unreadable slots, not by event
                try:
                    gap = evs.index(None, at)
                except ValueError:
                    gap = len(evs)
                if gap > at:
                    out += evs[at:gap]
                    index += gap - at
                    self.stalls = 0
                if gap == len(evs):
                    break
                self.stalls += 1
                if self.stalls < 3:
                    stalled = True
                    break
                self.stalls = 0  # corrupt: skipped
                index += 1
                at = gap + 1
            piece = min(READ_SLOTS, piece * 8)
        self.next_index = index
        return out


def open_logs_budget() -> int:
    """Logs a follower keeps open between polls: a quarter of the soft open-files limit
    (the rest for the process's other files), at least 16."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        return 1 << 20
    return 1 << 20 if soft < 0 or soft == resource.RLIM_INFINITY else max(16, soft // 4)


class RunFollower:
    """Polls every rank log of a run dir; `poll()` returns the events new or changed since,
    per incarnation."""

    def __init__(self, run_dir: str | Path, backlog: int | None = None):
        self.run_dir = Path(run_dir)
        # a str, made once: a Path joined on every poll was a tenth of an idle poll
        self._ranks_dir = os.fspath(self.run_dir / "ranks")
        from distdoctor.runlog import kept

        kept.attach(self.run_dir)  # the live diagnosis reads what the run keeps
        # events already in a log when it is first seen that are read (None: all of them);
        # a viewer joining a long job needs the present, not a ring's worth of history
        self.backlog = backlog
        self.feeds: dict[tuple[int, int], RankFeed] = {}  # (rank, log number) -> feed
        self.retired: dict[tuple[int, int], RankFeed] = {}  # finished, file closed
        self.unreadable: dict[tuple[int, int], str] = {}
        # logs refused for what is at their name (a FIFO, a link), or still unreadable
        # RESCAN_S after they first were (no log takes that long to be made): looked at
        # again only with the next full listing, and opened again only if what is at
        # their name changed since (10,000 junk files were opened on every poll)
        self._refused: set[tuple[int, int]] = set()
        self._failed: dict[tuple[int, int], tuple[tuple | None, float]] = {}  # (what, since)
        self._given_up: set[tuple[int, int]] = set()  # let go for an error: never again
        self._noted: set[tuple[int, int]] = set()  # metadata said unreadable, once
        self.meta: dict[tuple[int, int], dict] = {}  # (rank, log number) -> metadata
        self.incarnations = Incarnations()
        self.newest: int = 0  # the newest incarnation seen
        self.said: list[str] = []  # one line per log that could no longer be read
        # the last poll found more than events: a new log, or a log closed (its rank shut
        # down) or let go; a reader that skips its idle passes looks at the ranks then
        self.moved = False
        self.brought = False  # the last poll returned events other than samples
        self.pace = Pace()
        self._ranks_mtime = -1
        self._meta_tried: dict[tuple[int, int], tuple[float, int]] = {}
        self._scanned_s = -math.inf
        self._quiet: dict[tuple[int, int], tuple[int, float]] = {}  # heartbeat, since
        self.budget = open_logs_budget()

    def _discover(self) -> None:
        """Pick up rank logs that appeared. Listing the folder costs O(logs) per poll, so
        it is listed only when its mtime moved, while an unreadable log may still be
        being made (for RESCAN_S), or every RESCAN_S. File systems stamp mtimes coarsely
        (ext4: a clock tick), so a file created in the tick of the last listing leaves
        the mtime unchanged: a folder changed within the last RESCAN_S is listed on
        every poll."""
        ranks_dir = self._ranks_dir
        try:
            mtime = os.stat(ranks_dir).st_mtime_ns
        except OSError:
            return
        now = time.monotonic()
        settled = time.time_ns() - mtime > RESCAN_S * 1e9
        if (mtime == self._ranks_mtime and settled and now - self._scanned_s < RESCAN_S
                and self._refused.issuperset(self.unreadable)):
            return
        self._ranks_mtime, self._scanned_s = mtime, now
        try:
            names = os.listdir(ranks_dir)
        except OSError:
            return
        found, ranks_at = [], ranks_dir
        for name in names:
            parsed = parse_log_name(name)
            if parsed is None or parsed[2] != "ring":
                continue
            key = parsed[:2]
            if key in self.feeds or key in self.retired or key in self._given_up:
                continue
            # ring_path's name, as a str: a Path for each of 10,000 refused names took
            # most of a listing's time
            at = os.path.join(ranks_at, f"{rank_stem(*key)}.ring")
            what, since = _what_is_at(at), self._failed.get(key, (None, now))[1]
            if key in self._refused and self._failed.get(key, (None,))[0] == what:
                continue  # the same file that was refused: not read again
            path = Path(at)
            try:
                log = RankLog(path)
                if log.rank != key[0]:  # a copied or crafted file: its events misplaced
                    log.close()
                    raise NotALog(f"{path.name} says it is rank {log.rank}: not this "
                                  f"rank's log; left out")
            except NotALog as exc:
                if key not in self._refused:
                    self._refused.add(key)
                    self.said.append(str(exc))
                self.unreadable[key], self._failed[key] = str(exc), (what, since)
                continue
            except UserError as exc:
                # maybe still being created: tried again on the next polls, then as refused
                self.unreadable[key], self._failed[key] = str(exc), (what, since)
                if now - since > RESCAN_S:
                    self._refused.add(key)
                continue
            self.unreadable.pop(key, None)
            self._refused.discard(key)
            self._failed.pop(key, None)
            if len(self.feeds) + len(found) >= self.budget:
                log.park()
            found.append((log.created_wall_ns, key[1], key[0], log))
            self.moved = True
        # in the order they were made: that numbers the incarnations (runlog.incarnations)
        for _, number, rank, log in sorted(found, key=lambda t: t[:3]):
            feed = RankFeed(log, self.incarnations.assign(rank, log.launch))
            self.feeds[(rank, number)] = feed
            if self.backlog is not None:
                try:
                    feed.next_index = max(0, log.header().head - self.backlog)
                except Exception as exc:  # (see poll_incarnations)
                    self._let_go((rank, number), feed, _why(log, exc))
                    continue
            if len(self.feeds) > self.budget:
                log.park()
            self.newest = max(self.newest, feed.incarnation)
            self._load_meta((rank, number))

    def _load_meta(self, key: tuple[int, int], now_too: bool = False) -> None:
        """A log's metadata. A rank creates its log a moment before its metadata, so one
        not there yet (or half written) is tried again soon, then less and less often, up
        to every RESCAN_S (a rank that never writes it costs little). `now_too`: try even
        if the last try was a moment ago (the last pass: who is local decides who died).
        Metadata that is not readable is said once, and counts as missing."""
        now = time.monotonic()
        last, tries = self._meta_tried.get(key, (-math.inf, 0))
        if not now_too and now - last < min(RESCAN_S, META_RETRY_S * 2 ** (tries - 1)):
            return
        self._meta_tried[key] = (now, tries + 1)
        meta, note = rank_meta_at(rank_meta_path(self.run_dir, *key))
        self.meta[key] = {} if meta.get("unreadable") else meta
        if note and key not in self._noted:  # said once; tried again as a missing one
            self._noted.add(key)
            self.said.append(f"{note}: its host and pid unknown"
                             if meta.get("unreadable") else note)

    def poll(self, final: bool = False) -> list[Event]:
        """New events and completions, of every incarnation."""
        return [ev for events in self.poll_incarnations(final).values() for ev in events]

    def poll_incarnations(self, final: bool = False) -> dict[int, list[Event]]:
        """New events and completions, per incarnation. `final`: the last poll of a run
        (metadata still missing is looked for once more, whenever it was last tried)."""
        self.moved = False
        self._discover()
        logs_of: dict[int, list[list[Event]]] = {}  # incarnation -> each log's new events
        for i, (key, feed) in enumerate(list(self.feeds.items())):
            if not self.meta.get(key):
                self._load_meta(key, now_too=final)
            try:
                before, feed.header = feed.header, feed.log.header()
                if before is None or before.closed != feed.header.closed:
                    self.moved = True
                # completions of ops seen in flight
                events = []
                for index in list(feed.pending):
                    ev = feed.log.read_one(index)
                    if ev is None:  # overwritten: the ring wrapped past it
                        del feed.pending[index]
                    elif ev.t_end_ns is not None:  # t_end is written last
                        del feed.pending[index]
                        events.append(ev)
                new = feed.read_new()
            except Exception as exc:  # rewritten by someone else, or corrupt in a way no
                self._let_go(key, feed, _why(feed.log, exc))  # check foresaw: said once,
                continue  # that log no longer read, the others' events read on
            for ev in new:
                if ev.t_end_ns is None:  # spans too: a step's end gives its wall time
                    feed.pending[ev.index] = None
            while len(feed.pending) > MAX_PENDING:
                del feed.pending[next(iter(feed.pending))]
            events.extend(new)
            if i >= self.budget:  # past what it may hold open: opened again next poll
                feed.log.park()
            if events:
                logs_of.setdefault(feed.incarnation, []).append(events)
            elif not final and self._finished(key, feed):
                self._let_go(key, feed)
        out = {i: interleaved(logs) for i, logs in logs_of.items()}
        # the main threads' samples (50 a second a rank, tracer/steps.py) come whether
        # or not the job issues ops: taken in, but news only with something else
        self.brought = any(ev.kind != "sample" for events in out.values() for ev in events)
        return out

    def plan(self, now_s: float, forced: bool, exits, news) -> bool | None:
        """The reader's pass after a poll, at the job's pace (runlog.pace): True when the
        time-driven checks are due, False when only what changed is, None when nothing
        is. A log that appeared or closed makes them due at once; `news`: what else
        changed for the reader (its own input, e.g. lines of the job's output)."""
        return self.pace.plan(now_s, forced or self.moved, exits,
                              bool(self.brought or self.said or news))

    def _finished(self, key: tuple[int, int], feed: RankFeed) -> bool:
        """Read to its end, and either closed or left behind by a newer log of its rank
        whose heartbeat stopped a while ago (killed with its launch)."""
        header = feed.header
        if feed.next_index < header.head:
            return False
        if header.closed and not feed.pending:
            return True
        if not any(r == key[0] and n > key[1] for r, n in self.feeds):
            return False
        now = time.monotonic()
        hb, since = self._quiet.get(key, (None, now))
        if hb != header.heartbeat_mono_ns:
            self._quiet[key] = (header.heartbeat_mono_ns, now)
            return False
        return now - since > RETIRE_S

    def _let_go(self, key: tuple[int, int], feed: RankFeed, why: str | None = None) -> None:
        self.moved = True
        del self.feeds[key]
        self._quiet.pop(key, None)
        try:
            feed.log.close()
        except OSError:
            pass
        if why is None:
            self.retired[key] = feed
        else:
            self.unreadable[key] = why
            self._given_up.add(key)
            self.said.append(why)

    def ranks_of(self, incarnation: int) -> dict[int, RankFeed]:
        """rank -> its feed in `incarnation` (followed or let go)."""
        out = {k[0]: f for k, f in self.retired.items() if f.incarnation == incarnation}
        out.update({k[0]: f for k, f in self.feeds.items() if f.incarnation == incarnation})
        return out

    def meta_of(self, incarnation: int) -> dict[int, dict]:
        """rank -> metadata of its log in `incarnation`."""
        return {k[0]: self.meta.get(k) or {} for k, f in
                [*self.retired.items(), *self.feeds.items()] if f.incarnation == incarnation}

    def headers(self, incarnation: int) -> dict[int, RingHeader]:
        return {r: f.header for r, f in self.ranks_of(incarnation).items()
                if f.header is not None}

    def live_incarnations(self) -> set[int]:
        """Incarnations with a log still followed."""
        return {f.incarnation for f in self.feeds.values()}

    def close(self) -> None:
        for feed in self.feeds.values():
            try:
                feed.log.close()
            except OSError:
                pass


def _what_is_at(path: str) -> tuple | None:
    """What is at a log's name, to tell whether it changed (never followed, never opened):
    its inode, kind, size and time of change; None when nothing is."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_ino, st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def _why(log: RankLog, exc: Exception) -> str:
    """The line said for a log let go for `exc`."""
    if isinstance(exc, UserError):
        return str(exc)
    return (f"event log {log.path} could not be read ({type(exc).__name__}: "
            f"{str(exc)[:200]}); no longer read")


def wait_for_run_dir(path: Path, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (path / "run.json").exists():
            return True
        time.sleep(0.1)
    return False
