"""The collector's copy of every node's run dir, kept as one run dir: the forwarded frames
are written back into the files they were read from (event logs in their own layout,
rank metadata, probe files, exit codes), so `watch`, `diagnose` and `show` read the copy
as they read a local run, with no code of their own for it.

Every frame is checked whole before any of it is written: a node that sends what no
forwarder sends is dropped (WireError) and what it sent before stays.
"""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

from distdoctor.collect import wire
from distdoctor.errors import UserError
from distdoctor.runlog import format as F
from distdoctor.runlog.reader import RankLog
from distdoctor.runlog.ring import RingWriter
from distdoctor.runlog.rundir import rank_meta_path, ring_path, write_json_atomic

MAX_RANK = 1 << 24
# a node has a few GPUs (each may start again); the cap bounds one node's share of disk
MAX_LOGS_PER_NODE = 1024
MAX_FINISHED = 1 << 16
MAX_EXITS = 1 << 20
MAX_STRINGS_BYTES = 64 << 20
MAX_COMPLETED = 1 << 16  # completed collectives of a log awaiting its next STATE frame
_SLOT_KIND = 8  # a slot's kind byte, after its event number
HOST_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}\Z")


class Mirror:
    """The copy: which node sends which rank, and the exit codes of all."""

    def __init__(self, run_dir: str | Path, on_finding=None, hang_timeout_s: float | None = None):
        """`on_finding(f)`: called once per finding a node forwards (a service prints it)."""
        from distdoctor.collect.fleet import FleetEngine
        from distdoctor.collect.links import CopyWaits, LinkWatch

        self.run_dir = Path(run_dir)
        self.links = LinkWatch()  # slow links between nodes, from logs or digests
        self.copy_waits = CopyWaits(self.links)
        self.fleet = FleetEngine(hang_timeout_s, links=self.links)  # from digests
        self.on_finding = on_finding
        self._told: set[tuple] = set()
        (self.run_dir / "ranks").mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._senders: dict[int, NodeMirror] = {}  # rank -> the node that sends it
        # (rank, log number) -> (layout, copy)
        self._rings: dict[tuple[int, int], tuple[tuple, RingWriter]] = {}
        self._exits: dict[int, dict] = {}
        self._findings: dict[str, list] = {}  # host -> what its `run` alone found

    def ring_for(self, rank: int, log: int, node: NodeMirror, layout: tuple[int, int, int],
                 launch: dict | None = None) -> RingWriter:
        """The copy of `rank`'s log number `log` that `node` writes, under the log's own
        name. A node that reconnects writes on into the same file (readers keep their
        place); a log whose layout changed gets a new file, put in place whole (never
        truncated under a reader)."""
        capacity, strings_size, pid = layout
        with self._lock:
            other = self._senders.get(rank)
            # the same host again is the same node reconnecting (its old connection may
            # not have timed out yet); another host sending the rank is a mistake
            if (other is not None and other is not node and not other.closed
                    and other.host != node.host):
                raise wire.WireError(f"rank {rank} is already sent by node {other.host}")
            self._senders[rank] = node
            have = self._rings.get((rank, log))
            if have is not None and have[0] == layout:
                return have[1]
            ring = RingWriter(str(ring_path(self.run_dir, rank, log)), rank,
                              min(capacity, wire.MIRROR_SLOTS) * F.SLOT_SIZE, strings_size,
                              pid=pid, launch=launch, log_number=log)
            if have is not None:
                have[1].close()
            self._rings[(rank, log)] = (layout, ring)
            return ring

    def host_of(self) -> dict[int, str]:
        """rank -> the node that sends it."""
        with self._lock:
            return {r: node.host for r, node in self._senders.items()}

    def newest_logs(self) -> dict[int, tuple[int, str]]:
        """rank -> (the number of its newest log in the copy, the node that sends it)."""
        with self._lock:
            out: dict[int, tuple[int, str]] = {}
            for rank, log in self._rings:
                node = self._senders.get(rank)
                if node is not None and (rank not in out or log > out[rank][0]):
                    out[rank] = (log, node.host)
            return out

    def set_findings(self, host: str, findings: list) -> None:
        """The copy's findings.json: every node's own, which the viewer merges with the
        ones its engine finds over all the ranks."""
        from distdoctor.findings import write_findings

        with self._lock:
            self._findings[host] = findings
            write_findings(self.run_dir, [f for h in sorted(self._findings)
                                          for f in self._findings[h]])
            new = [f for f in findings if (host, _ident(f)) not in self._told]
            self._told.update((host, _ident(f)) for f in new)
        if self.on_finding is not None:
            for f in new:
                if _seen_from_a_receiver(f):
                    continue  # in findings.json: the collector names the culprit itself
                self.on_finding(f)

    def close(self) -> None:
        with self._lock:
            for _, ring in self._rings.values():
                ring.close()
            self._rings.clear()

    def lost_node(self, node: NodeMirror) -> None:
        """A node whose stream ended without its exit codes: its ranks are written as gone
        (no exit code), so a post-mortem of the copy takes their unclosed logs for dead
        ranks, as the live view did. A node that comes back sends its real ones."""
        self.add_exits([{"rank": r, "pid": None, "exit_code": None, "signal": None,
                         "stopped_by_distdoctor": False, "lost_with_node": node.host}
                        for r in sorted(node.ranks) if r not in self._exits])

    def add_exits(self, processes: list) -> None:
        with self._lock:
            for p in processes:
                if (isinstance(p, dict) and isinstance(p.get("rank"), int)
                        and (p["rank"] in self._exits or len(self._exits) < MAX_EXITS)):
                    self._exits[p["rank"]] = p
            write_json_atomic(self.run_dir / "exits.json", {
                "stopped_by_distdoctor": any(p.get("stopped_by_distdoctor")
                                             for p in self._exits.values()),
                "processes": [self._exits[r] for r in sorted(self._exits)]})


class NodeMirror:
    """One node's connection: applies its frames to the copy."""

    def __init__(self, mirror: Mirror, hello: dict):
        host = hello.get("host")
        if not isinstance(host, str) or not HOST_NAME.match(host):
            raise wire.WireError(f"HELLO names no usable host ({str(host)[:60]!r})")
        self.mirror, self.host = mirror, host
        self.rings: dict[tuple[int, int], RingWriter] = {}  # (rank, log number) -> copy
        # logs whose rank closed them, or let go to make room: their copies are complete
        # (or as complete as they will get); a late frame for one is dropped
        self.finished: dict[tuple[int, int], None] = {}
        self.ranks: set[int] = set()  # every rank this node sent a log of
        self.ended = False  # its exit codes came: the job on the node is over
        self.closed = False
        self._probes = None
        self.last_frame_s = time.monotonic()  # when it last sent anything
        # completed collectives (event numbers) per log, read back from the copy once
        # the STATE frame after them has counted the strings they name
        self._completed: dict[tuple[int, int], list[int]] = {}
        self._readers: dict[tuple[int, int], RankLog] = {}

    def apply(self, kind: int, rank: int, arg: int, payload: bytes, log: int = 0) -> None:
        self.last_frame_s = time.monotonic()
        if kind == wire.SAMPLES:
            return self._samples(payload)
        if kind == wire.EXITS:
            processes = wire.json_payload(kind, payload).get("processes")
            if not isinstance(processes, list):
                raise wire.WireError("EXITS frame has no list of processes")
            self.ended = True
            return self.mirror.add_exits(processes)
        if kind == wire.FINDINGS:
            return self.mirror.set_findings(self.host, _node_findings(payload))
        if kind == wire.DIGEST:
            digest = wire.json_payload(kind, payload)
            digest["host"] = self.host  # the node speaks for itself only
            self.mirror.fleet.apply(digest)
            self.ranks.update(p[0] for p in digest["ranks"] if isinstance(p, list) and p
                              and isinstance(p[0], int))
            return None
        if kind == wire.HELLO:
            raise wire.WireError("a second HELLO")
        if rank >= MAX_RANK:
            raise wire.WireError(f"rank {rank} is out of range")
        if (rank, log) in self.finished:
            return
        if kind == wire.META:
            meta = wire.json_payload(kind, payload)
            if meta.get("rank") != rank:
                raise wire.WireError(f"META frame of rank {rank} describes rank "
                                     f"{meta.get('rank')!r}")
            write_json_atomic(rank_meta_path(self.mirror.run_dir, rank, log), meta)
        elif kind == wire.OPEN:
            self._open(rank, log, payload)
        else:
            ring = self.rings.get((rank, log))
            if ring is None:
                raise wire.WireError(f"{wire.NAMES[kind]} frame for rank {rank} before OPEN")
            if kind == wire.STRINGS:
                if arg + len(payload) > ring.strings_size:
                    raise wire.WireError(f"STRINGS frame past rank {rank}'s string table")
                ring.put_strings(arg, payload)
            elif kind == wire.SLOTS:
                self._slots(ring, rank, arg, payload, log)
            elif kind == wire.STATE:
                closed = self._state(ring, rank, payload)
                self._read_completed(rank, log)
                if closed:
                    self._finish((rank, log))

    def _finish(self, key: tuple[int, int]) -> None:
        """Let a log's copy go: the file stays, this connection writes no more of it."""
        self.rings.pop(key, None)
        self._completed.pop(key, None)
        reader = self._readers.pop(key, None)
        if reader is not None:
            reader.close()
        self.finished[key] = None
        while len(self.finished) > MAX_FINISHED:
            del self.finished[next(iter(self.finished))]

    def _open(self, rank: int, log: int, payload: bytes) -> None:
        if not wire.OPEN_BODY.size <= len(payload) <= wire.OPEN_BODY.size + F.MAX_LAUNCH_BYTES:
            raise wire.WireError("OPEN frame of the wrong size")
        capacity, strings_size, pid = wire.OPEN_BODY.unpack_from(payload)
        launch = (wire.json_payload(wire.OPEN, payload[wire.OPEN_BODY.size:])
                  if len(payload) > wire.OPEN_BODY.size else None)
        if not 16 <= capacity < 1 << 40 or not 4096 <= strings_size <= MAX_STRINGS_BYTES:
            raise wire.WireError(f"OPEN frame of rank {rank} with an impossible layout")
        if (rank, log) not in self.rings and len(self.rings) >= MAX_LOGS_PER_NODE:
            self._finish(next(iter(self.rings)))  # the oldest: long finished, most likely
        self.ranks.add(rank)
        self.rings[(rank, log)] = self.mirror.ring_for(
            rank, log, self, (capacity, strings_size, pid), launch)
        reader = self._readers.pop((rank, log), None)  # the copy may be a new file now
        if reader is not None:
            reader.close()

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
        if not done:
            return
        reader = self._readers.get((rank, log))
        if reader is None:
            try:
                reader = self._readers[(rank, log)] = RankLog(
                    ring_path(self.mirror.run_dir, rank, log))
            except UserError:
                done.clear()
                return
        lo, hi = min(done), max(done)
        if hi - lo < 4 * len(done):  # mostly consecutive: one read (a tenth the cost)
            wanted = set(done)
            events = [ev for ev in reader.read_range(lo, hi + 1)
                      if ev is not None and ev.index in wanted]
        else:
            events = [reader.read_one(e) for e in done]
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
        try:
            text = payload.decode()
        except UnicodeDecodeError:
            raise wire.WireError("SAMPLES frame is not UTF-8") from None
        if not text.endswith("\n"):
            raise wire.WireError("SAMPLES frame does not end a line")
        if self._probes is None:
            from distdoctor.probes.sampler import ProbeFile, samples_path

            self._probes = ProbeFile(samples_path(self.mirror.run_dir, self.host),
                                     self.host, interval_s=1.0)
        self._probes.write(text)

    def close(self) -> None:
        """The connection ended; the copies of its logs stay (the Mirror closes them)."""
        self.closed = True
        self.rings.clear()
        for reader in self._readers.values():
            reader.close()
        self._readers.clear()
        if self._probes is not None:
            self._probes.close()


def _ident(f) -> tuple:
    """What makes a finding news: its summary (two errors of one rank in the job's output
    are two), but a straggler's summary moves with its numbers: its ranks."""
    return f.key if f.kind == "straggler" else (f.summary,)


def _node_findings(payload: bytes) -> list:
    """A FINDINGS frame's findings that came from the job's output, and (from a node that
    sends digests) its stragglers (a node's own engine saw only its own ranks: its other
    findings are the collector's to make)."""
    from distdoctor.findings import Finding

    items = wire.json_payload(wire.FINDINGS, payload).get("findings")
    if not isinstance(items, list):
        raise wire.WireError("FINDINGS frame has no list of findings")
    try:
        found = [Finding.from_json(d) for d in items[:100]]
        if not all(isinstance(f.summary, str) and all(isinstance(r, int) for r in f.ranks)
                   for f in found):
            raise TypeError
    except (KeyError, TypeError, ValueError, AttributeError):
        raise wire.WireError("FINDINGS frame holds something that is not a finding") from None
    return [f for f in found if f.details.get("source") == "log" or f.kind in wire.NODE_KINDS]


def _seen_from_a_receiver(f) -> bool:
    """A mismatch a node's job output told with no culprit (gloo's "received more than
    the buffer holds", printed by the rank that received): the collector, which sees every
    node's ops, announces the traced mismatch that names the rank instead."""
    return f.kind == "mismatch" and not f.ranks and f.details.get("source") == "log"
