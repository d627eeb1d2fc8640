"""One node's connection to the collector: its frames applied to the copy (mirror.py),
each checked whole first, within the bounds of limits.py (past one: WireError, and the
server drops the node with one line). Its log copies are written through the Mirror's
open-file budget (copies.OpenCopies): a copy let go is reopened where it was.

Frames of ranks another node owns are set aside (claims.py), and their signs of the rank
running are still read (a log opened, its head or heartbeat moving, its digest position
moving): the rank passes to this node when its owner is gone for it (a log's frames:
then the node is dropped once, so that its reconnection sends the rank's logs whole)."""

from __future__ import annotations

import re
import time

from distdoctor.collect import wire
from distdoctor.collect.copies import Copy, append_samples
from distdoctor.collect.digest import HeldDigests
from distdoctor.collect.digest_fields import digest_ranks
from distdoctor.collect.limits import (
    MAX_COMPLETED,
    MAX_EXITS_FRAMES,
    MAX_FINISHED,
    MAX_HELD_META_BYTES,
    MAX_LOGS_PER_NODE,
    MAX_META_BYTES,
    MAX_RANK,
    MAX_RANKS_PER_NODE,
    MAX_STRINGS_BYTES,
)
from distdoctor.collect.lost import LOST_S
from distdoctor.collect.peer_data import node_exits, node_findings
from distdoctor.collect.peer_numbers import lines_within, numbers_within
from distdoctor.errors import UserError
from distdoctor.runlog import format as F
from distdoctor.runlog.ring import RingWriter
from distdoctor.runlog.rundir import rank_meta_path, write_json_atomic

_SLOT_KIND = 8  # a slot's kind byte, after its event number
HOST_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}\Z")


class NodeMirror:
    """One node's connection: applies its frames to the copy."""

    def __init__(self, mirror, hello: dict):
        """`mirror`: the copy (mirror.Mirror); `hello`: the node's HELLO."""
        host = hello.get("host")
        if not isinstance(host, str) or not HOST_NAME.match(host):
            raise wire.WireError(f"HELLO names no usable host ({str(host)[:60]!r})")
        self.mirror, self.host = mirror, host
        self.rings: dict[tuple[int, int], Copy] = {}  # (rank, log number) -> copy
        # logs whose rank closed them, or let go to make room: their copies are complete
        # (or as complete as they will get); a late frame for one is dropped
        self.finished: dict[tuple[int, int], None] = {}
        self.ranks: set[int] = set()  # every rank this node sent a log of
        self.ended = False  # its exit codes came: the job on the node is over
        self.closed = False
        self.exits_frames = 0
        self.last_frame_s = time.monotonic()  # when it last sent anything
        # completed collectives (event numbers) per log, read back from the copy once
        # the STATE frame after them has counted the strings they name
        self._completed: dict[tuple[int, int], list[int]] = {}
        self.digests = HeldDigests()
        self.closed_s = 0.0  # when the connection ended
        # rank -> when it last showed the rank running (claims.py: what its claim rests
        # on): a log opened, a rank first in a digest, or as `moving`; and when the rank's
        # head, heartbeat or digest clock last moved (a conflict is two claims that move)
        self.alive: dict[int, float] = {}
        self.moving: dict[int, float] = {}
        self.since: dict[int, float] = {}  # rank -> when its current run of moves began
        self.aside: dict[int, tuple | None] = {}  # rank set aside -> its launch (incarnation)
        self.aside_logs: dict[tuple[int, int], tuple | None] = {}  # their logs, the same
        self._words: dict[tuple[int, int], tuple] = {}  # log -> its last (head, heartbeat)
        self._clocks: dict[int, object] = {}  # rank -> its digest position's clock
        self._held_meta: dict[tuple[int, int], tuple[dict, int]] = {}  # (_hold_meta)
        self._held_bytes = 0

    def apply(self, kind: int, rank: int, arg: int, payload: bytes, log: int = 0) -> None:
        self.last_frame_s = time.monotonic()
        if self.mirror.evicted and self.host in self.mirror.evicted:  # (shares.py)
            why = self.mirror.evicted.pop(self.host, None)
            if why is not None:
                raise wire.WireError(why)
        if kind == wire.SAMPLES:
            return self._samples(payload)
        if kind == wire.EXITS:
            return self._exits(payload)
        if kind == wire.FINDINGS:
            return self.mirror.set_findings(self.host, node_findings(payload))
        if kind == wire.DIGEST:
            return self._digest(payload)
        if kind == wire.SOURCE:  # the run's kept sources (collect/source_copies.py)
            return self.mirror.sources.apply(payload)
        if kind == wire.HELLO:
            raise wire.WireError("a second HELLO")
        if rank >= MAX_RANK:
            raise wire.WireError(f"rank {rank} is out of range")
        if (rank, log) in self.finished:
            return
        if kind == wire.META:
            self._meta(rank, log, payload)
        elif kind == wire.OPEN:
            self._open(rank, log, payload)
        else:
            copy = self.rings.get((rank, log))
            if copy is not None and copy.aside:  # a claim shown false (claims.py)
                self._aside_log((rank, log))
                copy = None
            if copy is not None:
                self._log_frame(kind, copy, rank, arg, payload, log)
            elif (rank, log) in self.aside_logs:
                self._set_aside(kind, rank, log, payload)
            else:
                raise wire.WireError(f"{wire.NAMES[kind]} frame for rank {rank} before OPEN")

    def _sign(self, rank: int, log: int, payload: bytes) -> None:
        """A STATE frame whose head or heartbeat moved: the rank runs here."""
        if len(payload) == wire.STATE_BODY.size:
            words = wire.STATE_BODY.unpack(payload)
        elif len(payload) == wire.STATE_BODY_V2.size:
            words = wire.STATE_BODY_V2.unpack(payload)
        else:
            return  # (refused as it is applied; ignored while set aside)
        now = (words[0], words[4])
        moved = self._words.get((rank, log), now) != now
        self._words[(rank, log)] = now
        if moved:
            self._moved(rank, time.monotonic())
            copy = self.rings.get((rank, log))
            if copy is not None:
                copy.lived = True  # (a log that never ran is no rank's: claims.py)
                if self.mirror.owners.of.get(rank) != self.host:
                    self.mirror.moved_elsewhere(self, rank)

    def _moved(self, rank: int, now: float) -> None:
        """The rank moved here: a run of moves begins after LOST_S without one (claims.py:
        a conflict is two runs that overlap, not a rank that stopped here and started
        there)."""
        if now - self.moving.get(rank, now - LOST_S) >= LOST_S:
            self.since[rank] = now
        self.alive[rank] = self.moving[rank] = now

    def _set_aside(self, kind: int, rank: int, log: int, payload: bytes) -> None:
        """A frame of a log set aside: its signs read, and its claim tried again; once the
        rank passes here, every rank of this node set aside that may pass goes with it,
        and the node is dropped, to send their logs again whole as it reconnects."""
        if kind != wire.STATE:
            return
        self._sign(rank, log, payload)
        if not self.mirror.claim(self, [rank], self.aside_logs[(rank, log)], log):
            return
        for r, launch in list(self.aside.items()):
            self.mirror.claim(self, [r], launch)
        raise wire.WireError(f"rank {rank} passed to it: it sends the rank's logs again "
                             f"whole as it reconnects")

    def _log_frame(self, kind: int, copy: Copy, rank: int, arg: int, payload: bytes,
                   log: int) -> None:
        closed = False
        try:
            with self.mirror.copies.writing(copy) as ring:
                if kind == wire.STRINGS:
                    if arg + len(payload) > ring.strings_size:
                        raise wire.WireError(f"STRINGS frame past rank {rank}'s string table")
                    ring.put_strings(arg, payload)
                elif kind == wire.SLOTS:
                    self._slots(ring, rank, arg, payload, log)
                elif kind == wire.STATE:
                    closed = self._state(ring, rank, payload)
                    copy.lived = copy.lived or closed or ring.head() > 0  # (claims.py)
        except OSError as exc:  # a full disk, the copy removed under us
            raise wire.WireError(f"cannot write the copy of rank {rank}'s log: "
                                 f"{exc.strerror or exc}") from None
        if kind == wire.STATE:
            self._sign(rank, log, payload)
            self._read_completed(rank, log)
            if closed:
                self._finish((rank, log))

    def _meta(self, rank: int, log: int, payload: bytes) -> None:
        if len(payload) > MAX_META_BYTES:
            raise wire.WireError(f"META frame of rank {rank} of {len(payload):,} bytes (at "
                                 f"most {MAX_META_BYTES:,})")
        meta = wire.json_payload(wire.META, payload)
        if not numbers_within(meta):
            raise wire.WireError(f"META frame of rank {rank} has a number that is not "
                                 f"finite or not within 64 bits")
        if meta.get("rank") != rank:
            raise wire.WireError(f"META frame of rank {rank} describes rank "
                                 f"{meta.get('rank')!r}")
        owner = self.mirror.owners.of.get(rank)
        if owner not in (None, self.host) and (rank, log) not in self.rings:
            self.mirror.held(self, owner, rank, log)
            return self._hold_meta((rank, log), meta, len(payload))
        if self.mirror.claim(self, [rank]):  # (else another node's rank: set aside)
            self._write_meta(rank, log, meta)

    def _hold_meta(self, key: tuple[int, int], meta: dict, size: int) -> None:
        """Another node's rank: a forwarder sends a log's META before its OPEN, and the
        OPEN's launch decides (a newer launch passes at once): held for it, the oldest
        let go past MAX_HELD_META_BYTES."""
        held = self._held_meta
        self._held_bytes += size - held.pop(key, (None, 0))[1]
        held[key] = (meta, size)
        while self._held_bytes > MAX_HELD_META_BYTES or len(held) > MAX_LOGS_PER_NODE:
            self._held_bytes -= held.pop(next(iter(held)))[1]

    def _write_meta(self, rank: int, log: int, meta: dict) -> None:
        n = self.mirror.copy_log(rank, log)
        try:
            write_json_atomic(rank_meta_path(self.mirror.run_dir, rank, n), meta)
            self.mirror.owners.made(rank, n)
        except OSError as exc:
            raise wire.WireError(f"cannot write rank {rank}'s metadata: "
                                 f"{exc.strerror or exc}") from None

    def _exits(self, payload: bytes) -> None:
        self.exits_frames += 1
        if self.exits_frames > MAX_EXITS_FRAMES:
            raise wire.WireError(f"more than {MAX_EXITS_FRAMES} EXITS frames")
        entries = node_exits(payload)
        own = set(self.mirror.claim(self, [p["rank"] for p in entries], past=True))
        entries = [p for p in entries if p["rank"] in own]  # (others' ranks: set aside)
        self.ended = True
        self.mirror.add_exits(entries)

    def _digest(self, payload: bytes) -> None:
        digest = wire.json_payload(wire.DIGEST, payload)
        digest["host"] = self.host  # the node speaks for itself only
        ranks = digest_ranks(digest)
        now = time.monotonic()
        for item in digest["ranks"]:  # a position whose clock moved: the rank runs here
            r, clock = item[0], item[4] if len(item) > 4 else None
            if r not in self._clocks:
                self.alive[r] = now
            elif self._clocks[r] != clock:
                self._moved(r, now)
            self._clocks[r] = clock
        self._prune()
        granted = self.mirror.claim(self, ranks, past=True)
        if len(granted) < len(ranks):  # other nodes' ranks: set aside, or their past
            own = set(granted)
            digest["ranks"] = [item for item in digest["ranks"] if item[0] in own]
            ranks = granted
        self.digests.check(ranks, len(payload))
        self.mirror.fleet.apply(digest, members_of=self.mirror.owners.of)
        self.digests.hold(ranks, len(payload))

    def _finish(self, key: tuple[int, int]) -> None:
        """Let a log's copy go: the file stays, this connection writes no more of it."""
        self.rings.pop(key, None)
        self._completed.pop(key, None)
        self._words.pop(key, None)
        self.finished[key] = None
        while len(self.finished) > MAX_FINISHED:
            del self.finished[next(iter(self.finished))]

    def _open(self, rank: int, log: int, payload: bytes) -> None:
        if not wire.OPEN_BODY.size <= len(payload) <= wire.OPEN_BODY.size + F.MAX_LAUNCH_BYTES:
            raise wire.WireError("OPEN frame of the wrong size")
        capacity, strings_size, pid = wire.OPEN_BODY.unpack_from(payload)
        launch = (wire.json_payload(wire.OPEN, payload[wire.OPEN_BODY.size:])
                  if len(payload) > wire.OPEN_BODY.size else None)
        if launch is not None and not numbers_within(launch):
            raise wire.WireError(f"OPEN frame of rank {rank} has a number that is not "
                                 f"finite or not within 64 bits")
        if not 16 <= capacity < 1 << 40 or not 4096 <= strings_size <= MAX_STRINGS_BYTES:
            raise wire.WireError(f"OPEN frame of rank {rank} with an impossible layout")
        if (rank, log) not in self.rings and len(self.rings) >= MAX_LOGS_PER_NODE:
            self._finish(next(iter(self.rings)))  # the oldest: long finished, most likely
        self.alive[rank] = time.monotonic()  # a log opened: the rank runs here
        copy = self.mirror.ring_for(rank, log, self, (capacity, strings_size, pid), launch)
        if copy is not None:
            self.rings[(rank, log)] = copy
            held = self._held_meta.pop((rank, log), None)
            if held is not None:
                self._held_bytes -= held[1]
                self._write_meta(rank, log, held[0])
            return
        self._aside_log((rank, log))
        self._prune()

    def _aside_log(self, key: tuple[int, int]) -> None:
        """A log of this node's set aside: its frames' signs read, nothing written."""
        self.rings.pop(key, None)
        self._completed.pop(key, None)
        if len(self.aside_logs) >= MAX_LOGS_PER_NODE:
            oldest = next(iter(self.aside_logs))
            del self.aside_logs[oldest]
            self._words.pop(oldest, None)
        self.aside_logs[key] = self.aside.get(key[0])

    def _prune(self) -> None:
        """The signs of ranks this node no longer owns nor sends set aside forgotten, once
        they are more than a few nodes' worth (ranks that moved away, again and again)."""
        if len(self.alive) + len(self._clocks) <= 4 * MAX_RANKS_PER_NODE:
            return
        of, host = self.mirror.owners.of, self.host
        for signs in (self.alive, self.moving, self.since, self._clocks):
            for r in [r for r in signs if of.get(r) != host and r not in self.aside]:
                del signs[r]

    def _slots(self, ring: RingWriter, rank: int, first: int, payload: bytes,
               log: int) -> None:
        if not payload or len(payload) % F.SLOT_SIZE:
            raise wire.WireError("SLOTS frame is not whole slots")
        records = [payload[at:at + F.SLOT_SIZE] for at in range(0, len(payload), F.SLOT_SIZE)]
        for i, rec in enumerate(records):
            if F.U64.unpack_from(rec, 0)[0] != first + i + 1:
                raise wire.WireError(f"SLOTS frame of rank {rank}: slot {i} does not hold "
                                     f"event {first + i}")
        head = ring.head()
        done = self._completed.setdefault((rank, log), [])
        for i, rec in enumerate(records):
            if first + i + ring.capacity > head:  # older: its slot holds a newer event
                ring.put_slot(first + i, rec)
                if (rec[_SLOT_KIND] == F.KIND_COLLECTIVE
                        and rec[F.OFF_SLOT_STATUS] == F.STATUS_OK
                        and F.U64.unpack_from(rec, F.OFF_SLOT_END)[0]
                        and len(done) < MAX_COMPLETED):
                    done.append(first + i)

    def _read_completed(self, rank: int, log: int) -> None:
        """The collectives of this log completed since its last STATE, decoded from the
        copy (their strings are in now), to the links' watch (links.py)."""
        done = self._completed.get((rank, log))
        copy = self.rings.get((rank, log))
        if not done or copy is None:
            return
        try:
            with self.mirror.copies.reading(copy) as reader:
                lo, hi = min(done), max(done)
                if hi - lo < 4 * len(done):  # mostly consecutive: one read (a tenth the cost)
                    wanted = set(done)
                    events = [ev for ev in reader.read_range(lo, hi + 1)
                              if ev is not None and ev.index in wanted]
                else:
                    events = [reader.read_one(e) for e in done]
        except UserError:
            events = []
        for ev in events:
            if ev is not None:  # (None: overwritten already, in a small copy)
                self.mirror.copy_waits.completed(ev, self.host)
        done.clear()

    @staticmethod
    def _state(ring: RingWriter, rank: int, payload: bytes) -> bool:
        """Applies the header words; True when the rank has closed the log."""
        if len(payload) == wire.STATE_BODY.size:
            (head, used, count, dropped, hb_mono, hb_wall, closed, exit_error,
             exit_code) = wire.STATE_BODY.unpack(payload)
        elif len(payload) == wire.STATE_BODY_V2.size:  # a node of the previous version
            head, used, count, dropped, hb_mono, hb_wall, closed = \
                wire.STATE_BODY_V2.unpack(payload)
            exit_error = exit_code = 0
        else:
            raise wire.WireError("STATE frame of the wrong size")
        if used > ring.strings_size:
            raise wire.WireError(f"STATE frame of rank {rank} counts more strings than fit")
        ring.put_state(head, used, count, dropped, hb_mono, hb_wall, closed, exit_error,
                       exit_code)
        return closed in F.CLOSED_WORDS

    def _samples(self, payload: bytes) -> None:
        from distdoctor.probes.sampler import DEFAULT_MAX_BYTES, samples_path

        try:
            text = payload.decode()
        except UnicodeDecodeError:
            raise wire.WireError("SAMPLES frame is not UTF-8") from None
        if not text.endswith("\n"):
            raise wire.WireError("SAMPLES frame does not end a line")
        if not lines_within(text):  # (a GPU at 10^400 C made every /metrics scrape a 500)
            raise wire.WireError("SAMPLES frame has a number that is not finite or not "
                                 "within 64 bits")
        try:
            append_samples(samples_path(self.mirror.run_dir, self.host), self.host, text,
                           DEFAULT_MAX_BYTES)
        except OSError as exc:
            raise wire.WireError(f"cannot write node {self.host}'s probe samples: "
                                 f"{exc.strerror or exc}") from None

    def close(self) -> None:
        """The connection ended; the copies of its logs stay (the Mirror closes them)."""
        self.closed = True
        self.closed_s = time.monotonic()
        self.rings.clear()
