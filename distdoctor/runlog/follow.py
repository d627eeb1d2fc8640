"""Follow a run directory while the job writes it: new events, completions, heartbeats.

An op is written once when it enters (in flight) and its slot is updated in place when it
completes, so a follower re-reads the slots of the ops it last saw in flight. Rank logs
that appear later (a launcher starting ranks one by one) are picked up on the next poll.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from distdoctor.errors import UserError
from distdoctor.runlog.reader import Event, RankLog, RingHeader
from distdoctor.runlog.rundir import rank_meta_path, ring_path

# In-flight ops re-read per rank per poll, at most: async work that never reports its
# completion must not make every poll slower.
MAX_PENDING = 4096
RESCAN_S = 2.0  # the ranks folder is listed at least this often (see _discover)
META_RETRY_S = 0.25  # first retry of a rank's missing metadata; doubles up to RESCAN_S


@dataclass
class RankFeed:
    log: RankLog
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
        for ev in self.log.read_range(index, head):
            if ev is None:
                self.stalls += 1
                if self.stalls < 3:
                    break
            else:
                out.append(ev)
            self.stalls = 0
            index += 1
        self.next_index = index
        return out


class RunFollower:
    """Polls every rank log of a run dir; `poll()` returns events new or changed since."""

    def __init__(self, run_dir: str | Path, backlog: int | None = None):
        self.run_dir = Path(run_dir)
        # events already in a log when it is first seen that are read (None: all of them);
        # a viewer joining a long job needs the present, not a ring's worth of history
        self.backlog = backlog
        self.feeds: dict[int, RankFeed] = {}
        self.unreadable: dict[int, str] = {}
        self.meta: dict[int, dict] = {}
        self._ranks_mtime = -1
        self._meta_tried: dict[int, tuple[float, int]] = {}  # rank -> (last try, tries)
        self._scanned_s = -math.inf

    def _discover(self) -> None:
        """Pick up rank logs that appeared. Listing the folder costs O(ranks) per poll, so
        it is listed only when its mtime moved, while a log is still unreadable, or
        every RESCAN_S. File systems stamp mtimes coarsely (ext4: a clock tick), so a
        file created in the tick of the last listing leaves the mtime unchanged: a
        folder changed within the last RESCAN_S is listed on every poll."""
        ranks_dir = self.run_dir / "ranks"
        try:
            mtime = os.stat(ranks_dir).st_mtime_ns
        except OSError:
            return
        now = time.monotonic()
        settled = time.time_ns() - mtime > RESCAN_S * 1e9
        if (mtime == self._ranks_mtime and settled and not self.unreadable
                and now - self._scanned_s < RESCAN_S):
            return
        self._ranks_mtime, self._scanned_s = mtime, now
        for p in ranks_dir.glob("rank-*.ring"):
            try:
                rank = int(p.stem.split("-", 1)[1])
            except (IndexError, ValueError):
                continue
            if rank in self.feeds:
                continue
            try:
                feed = RankFeed(RankLog(ring_path(self.run_dir, rank)))
                if self.backlog is not None:
                    feed.next_index = max(0, feed.log.header().head - self.backlog)
                self.feeds[rank] = feed
                self.unreadable.pop(rank, None)
            except UserError as exc:
                self.unreadable[rank] = str(exc)  # maybe still being created: retry later
            self._load_meta(rank)

    def _load_meta(self, rank: int, now_too: bool = False) -> None:
        """A rank's metadata. A rank creates its log a moment before its metadata, so one
        not there yet (or half written) is tried again soon, then less and less often, up
        to every RESCAN_S (a rank that never writes it costs little). `now_too`: try even
        if the last try was a moment ago (the last pass: who is local decides who died)."""
        import json

        now = time.monotonic()
        last, tries = self._meta_tried.get(rank, (-math.inf, 0))
        if not now_too and now - last < min(RESCAN_S, META_RETRY_S * 2 ** (tries - 1)):
            return
        self._meta_tried[rank] = (now, tries + 1)
        try:
            self.meta[rank] = json.loads(rank_meta_path(self.run_dir, rank).read_text())
        except (OSError, ValueError):
            self.meta.setdefault(rank, {})

    def poll(self, final: bool = False) -> list[Event]:
        """New events and completions. `final`: the last poll of a run (metadata still
        missing is looked for once more, whenever it was last tried)."""
        self._discover()
        out: list[Event] = []
        for rank, feed in self.feeds.items():
            if not self.meta.get(rank):
                self._load_meta(rank, now_too=final)
            try:
                feed.header = feed.log.header()
                # completions of ops seen in flight
                for index in list(feed.pending):
                    ev = feed.log.read_one(index)
                    if ev is None:  # overwritten: the ring wrapped past it
                        del feed.pending[index]
                    elif ev.t_end_ns is not None:  # t_end is written last
                        del feed.pending[index]
                        out.append(ev)
                new = feed.read_new()
            except (ValueError, OSError):  # a file replaced under us: stop following it
                continue
            for ev in new:
                if ev.t_end_ns is None and ev.kind != "span":
                    feed.pending[ev.index] = None
            while len(feed.pending) > MAX_PENDING:
                del feed.pending[next(iter(feed.pending))]
            out.extend(new)
        return out

    def headers(self) -> dict[int, RingHeader]:
        return {r: f.header for r, f in self.feeds.items() if f.header is not None}

    def close(self) -> None:
        for feed in self.feeds.values():
            try:
                feed.log.close()
            except (ValueError, OSError):
                pass


def wait_for_run_dir(path: Path, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (path / "run.json").exists():
            return True
        time.sleep(0.1)
    return False
