"""The collector's copy of every node's run dir, kept as one run dir: the forwarded frames
are written back into the files they were read from (event logs in their own layout,
rank metadata, probe files, exit codes), so `watch`, `diagnose` and `show` read the copy
as they read a local run, with no code of their own for it.

Every frame is checked whole before any of it is written: a node that sends what no
forwarder sends, or more than a node may (limits.py: ranks, exits, findings, digests),
is dropped (WireError) and what it sent before stays; the other nodes go on. A rank
belongs to the host that sent it first while that host runs it; another host's frames
for it are set aside, and it passes to that host once its owner is gone for it, or for a
newer launch of the job (claims.py says what is believed, and why).

Bounds (limits.py states them, and the memory they make): per node at most
MAX_RANKS_PER_NODE ranks and MAX_COPIES_PER_NODE log copies, ~40 MiB for a hostile node
(~100 KB for an 8-rank one); in all MAX_RANKS ranks, ~1 GiB at 100,000 ranks. Open files:
the copies keep at most limits.copy_fd_budget() descriptors (copies.OpenCopies: the least
recently written is closed and reopened into the same file on its next frame), so the
collector's descriptors are its connections plus a fixed budget, whatever the ranks.
Measured: 100,000 ranks by digest (1,000 simulated nodes) held 264 MiB.

Started again on its own copy (`watch --listen --run-dir` of a collector's copy), the
Mirror writes on into the copies there (a reader keeps its place), and keeps the exit
codes, findings and rank owners already written.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from distdoctor.collect import wire
from distdoctor.collect.claims import BY_LAUNCH, RAN_ON, Claims
from distdoctor.collect.copies import Copy, OpenCopies, new_copy, reopen_copy
from distdoctor.collect.copy_exits import CopyExits
from distdoctor.collect.limits import (
    MAX_COPIES_PER_NODE,
    MAX_FINDINGS_BYTES,
    MAX_FINDINGS_BYTES_PER_NODE,
    MAX_HOSTS,
    MAX_LOG_NUMBER,
    MAX_NEW_FINDINGS,
    MAX_RANKS,
    MAX_RANKS_PER_NODE,
    copy_fd_budget,
)
from distdoctor.collect.lost import LOST_S
from distdoctor.collect.node_mirror import HOST_NAME, NodeMirror  # noqa: F401 (server's)
from distdoctor.collect.owners import Owners, incarnation
from distdoctor.collect.set_aside import put_aside
from distdoctor.collect.shares import gone_line, who_goes
from distdoctor.collect.source_copies import SourceCopies
from distdoctor.runlog.rundir import ring_path

EARLIER = "(before the collector started again)"  # findings.json's, at the start


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
        # nodes let go to make room in a collector-wide cap (shares.py) -> why: the
        # server drops their connections, saying why
        self.evicted: dict[str, str] = self.fleet.evicted
        self.on_finding = on_finding
        (self.run_dir / "ranks").mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self.owners = Owners(self.run_dir)  # rank -> its host (a collector's before too)
        self.exits = CopyExits(self.run_dir, self.owners)  # exits.json (a collector's before)
        self.claims = Claims(self.owners, self.exits)  # who may send which rank, and the news
        self.copies = OpenCopies(copy_fd_budget())
        self._senders = self.claims.senders  # rank -> the node that sends it
        # rank -> log number -> its copy (by rank: a move looks at the rank's copies, never
        # at every number up to its newest, which a peer's log number puts 65,535 on)
        self._rings: dict[int, dict[int, Copy]] = {}
        self._copies_of: dict[str, int] = {}  # host -> log copies it made
        self._findings: dict[str, list] = _earlier_findings(self.run_dir)  # host -> its own
        self._told: set[tuple] = {(None, _ident(f)) for f in self._findings.get(EARLIER, [])}
        self._told_by: dict[str, int] = {}  # host -> findings told
        self._findings_bytes: dict[str, int] = {}  # host -> its findings' JSON bytes
        self.sources = SourceCopies(self.run_dir)  # the nodes' kept sources, merged

    def claim(self, node: NodeMirror, ranks, launch: tuple | None = None,
              log: int | None = None, past: bool = False) -> list[int]:
        """The ranks of `ranks` that `node` may write now: its own, new ones, and those
        whose owner is gone for them or that it sends of a newer launch of the job
        (`launch`: owners.incarnation of its log `log`; the move said once). The others
        are set aside (said once; a conflict where `node` shows them running too).
        `past`: exit codes, a digest's positions: no sign of running the rank now unless
        it moves, so no rank taken from another without. WireError past
        MAX_RANKS_PER_NODE ranks of the node, or MAX_RANKS of the copy."""
        with self._lock:
            claims, owners, now = self.claims, self.owners, time.monotonic()
            mine, new, moves = [], [], {}
            for r in dict.fromkeys(ranks):
                owner = owners.of.get(r)
                if owner is None:
                    new.append(r)
                elif owner == node.host:
                    mine.append(r)
                elif owners.stale(node.host, r, log):  # its log of the rank's past, sent
                    self._both_move(node, r, now)  # again: no claim (a conflict if it runs)
                elif past and now - node.moving.get(r, now - LOST_S) >= LOST_S:
                    continue  # (its exit code, its rank's place: kept out, unsaid)
                else:
                    why = claims.why(node.host, owner, r, launch, now)
                    if why is None:
                        self._aside(node, owner, r, launch, now)
                    else:
                        moves.setdefault(owner, ([], why))[0].append(r)
            moved = [r for rs, _ in moves.values() for r in rs]
            if new or moved:
                if owners.count.get(node.host, 0) + len(new) + len(moved) > MAX_RANKS_PER_NODE:
                    raise wire.WireError(f"more than {MAX_RANKS_PER_NODE:,} ranks from one "
                                         f"node")
                if len(owners.of) + len(new) > MAX_RANKS:  # full: the nodes holding more go
                    for other in who_goes(owners.count, node.host, len(new), MAX_RANKS,
                                          "ranks"):
                        self._let_go(other, node.host)
                owners.claim(node.host, new)
                for owner, (rs, why) in moves.items():
                    to = {r: owners.next_log(r) for r in rs}
                    claims.took(rs, why, owner, {r: owners.base.get(r, 0) for r in rs}, to,
                                now)
                    if why != BY_LAUNCH:  # (a launch is believed at once: no proof)
                        self._put_aside(self._never_ran(rs, now))
                    owners.move(node.host, to, owner)
                    self.fleet.forget(rs)
                    claims.note("moved", owner, node.host, rs, why)
            granted = mine + new + moved
            if moved:
                claims.retract(node.host, moved)
            for r in granted:
                self._senders[r] = node
                node.aside.pop(r, None)
                claims.granted(node.host, r, launch)
        node.ranks.update(granted)
        return granted

    def _aside(self, node: NodeMirror, owner: str, rank: int, launch, now: float) -> None:
        """`node`'s claim of `owner`'s rank, set aside (caller: _lock); a conflict where
        both move it."""
        if rank not in node.aside and len(node.aside) >= MAX_RANKS_PER_NODE:
            raise wire.WireError(f"more than {MAX_RANKS_PER_NODE:,} ranks from one node")
        node.aside[rank] = launch
        self.claims.note("finished" if self.exits.finished(rank) else "aside", owner,
                         node.host, [rank])
        self._both_move(node, rank, now)

    def held(self, node: NodeMirror, owner: str, rank: int, log: int) -> None:
        """`node`'s META of `owner`'s rank, held for its OPEN: set aside unless that takes
        the rank (then unsaid: Claims.retract), or of the rank's past (stale)."""
        with self._lock:
            if not self.owners.stale(node.host, rank, log):
                self.claims.note("finished" if self.exits.finished(rank) else "aside",
                                 owner, node.host, [rank])

    def moved_elsewhere(self, node: NodeMirror, rank: int) -> None:
        """`node` moves a rank of its log that passed to another node (its own copy of
        the log goes on): a conflict where the new owner moves it too (a node cut off
        from its job's launcher whose ranks run on, or a claim of a forged launch)."""
        with self._lock:
            self._both_move(node, rank, time.monotonic())

    def _both_move(self, node: NodeMirror, rank: int, now: float) -> None:
        owner = self.owners.of.get(rank)
        if owner in (None, node.host):
            return
        # `node` ran the rank on through the launch that took it: owner's word alone, shown
        # so once owner runs it too (a conflict) or is gone for it (sent it and left)
        taken = self.claims.ran_through(node, rank)
        if taken is not None and self.claims.gone_why(owner, rank, now) is not None:
            return self._give_back(node, owner, rank, taken)
        if not self.claims.both_run(owner, node, rank, now):
            return
        if taken is None:
            return self.claims.conflict(owner, node.host, rank)
        self._give_back(node, owner, rank, taken)
        self.claims.kept_on(node.host, owner, rank)

    def _give_back(self, node: NodeMirror, owner: str, rank: int, taken) -> None:
        """`rank` is node's again as it was; owner's logs and lost entry of it set aside."""
        self._put_aside(self._copies_since([rank], taken.first))
        self.owners.give_back(node.host, rank, taken.base, owner, taken.first)
        self.claims.gave_back(rank, taken)
        self.exits.unlost(rank, owner)
        self.claims.note("moved", owner, node.host, [rank], RAN_ON.format(node.host))
        self._senders[rank] = node
        node.ranks.add(rank)
        self.fleet.forget([rank])

    def _copies_since(self, ranks, first: int | None = None) -> list[Copy]:
        """The copies of `ranks`' logs from `first` on (default: their owner's base)."""
        base = self.owners.base
        return [c for r in ranks for n, c in self._rings.get(r, {}).items()
                if n >= (base.get(r, 0) if first is None else first)]

    def _never_ran(self, ranks, now: float) -> list[Copy]:
        """The copies of `ranks` by their owner that show no event, no close and no move
        in LOST_S of its stream (a live rank's heartbeat moves each second): no rank's."""
        return [c for c in self._copies_since(ranks) if not c.lived
                and now - c.made_s >= LOST_S]

    def _put_aside(self, copies: list[Copy]) -> None:
        """Copies of a claim disproven: no rank's logs, no node writes them (set_aside.py)."""
        for copy in copies:
            copy.aside = True
            del self._rings[copy.key[0]][copy.key[1]]
            put_aside(copy, self.copies, self.run_dir)

    def copy_log(self, rank: int, log: int) -> int:
        """The copy's number of its owner's log `log` of `rank` (after an old owner's)."""
        n = self.owners.number(rank, log)
        if n > MAX_LOG_NUMBER:
            raise wire.WireError(f"rank {rank} has more than {MAX_LOG_NUMBER:,} logs in the "
                                 f"copy")
        return n

    def news(self) -> list[str]:
        """What changed hands since the last call, a line each (said once), and the
        conflicts' findings into findings.json when they changed."""
        with self._lock:
            lines = self.claims.lines()
            found = self.claims.findings() if self.claims.conflicts_changed else None
        if found is not None:
            self.set_findings("(owners)", found)
        return lines

    def _let_go(self, host: str, newcomer: str) -> None:
        """`host`'s ranks set free for `newcomer`'s (shares.py), their positions forgotten
        (their copies stay on disk); the server drops `host`."""
        ranks = self.owners.release(host)
        self.claims.forget(ranks)
        self.fleet.forget(ranks)
        self.evicted[host] = gone_line(len(ranks), MAX_RANKS, "ranks", newcomer)

    def ring_for(self, rank: int, log: int, node: NodeMirror, layout: tuple[int, int, int],
                 launch: dict | None = None) -> Copy | None:
        """The copy of `rank`'s log number `log` that `node` writes, under the log's own
        name (numbered after an old owner's: copy_log); None when the rank is set aside.
        A node that reconnects (or a collector started again) writes on into the same
        file (readers keep their place); a log whose layout changed gets a new file, put
        in place whole (never truncated under a reader)."""
        capacity, strings_size, pid = layout
        layout = (min(capacity, wire.MIRROR_SLOTS), strings_size, pid)
        if not self.claim(node, [rank], incarnation(launch), log):
            return None
        with self._lock:
            log = self.copy_log(rank, log)
            have = self._rings.get(rank, {}).get(log)
            if have is not None and have.layout == layout:
                return have
            path = ring_path(self.run_dir, rank, log)
            writer = reopen_copy(path, layout) if have is None else None
            lived = writer is not None or (have is not None and have.lived)
            if writer is None:
                if self._copies_of.get(node.host, 0) >= MAX_COPIES_PER_NODE:
                    raise wire.WireError(f"more than {MAX_COPIES_PER_NODE:,} logs from one "
                                         f"node")
                writer = new_copy(path, rank, log, layout, launch)
                self.owners.made(rank, log)
                self._copies_of[node.host] = self._copies_of.get(node.host, 0) + 1
            copy = Copy((rank, log), path, layout, writer, lived)
            if have is not None:
                self.copies.forget(have)
            self._rings.setdefault(rank, {})[log] = copy
        self.copies.added(copy)
        return copy

    def host_of(self) -> dict[int, str]:
        """rank -> the node that sends it."""
        with self._lock:
            return {r: node.host for r, node in self._senders.items()}

    def newest_logs(self) -> dict[int, tuple[int, str]]:
        """rank -> (the number of its newest log in the copy, the node that sends it)."""
        with self._lock:
            return {rank: (max(logs), self._senders[rank].host)
                    for rank, logs in self._rings.items() if logs and rank in self._senders}

    def set_findings(self, host: str, findings: list) -> None:
        """The copy's findings.json: every node's own, which the viewer merges with the
        ones its engine finds over all the ranks. A node that tells more than
        MAX_NEW_FINDINGS distinct ones is refused."""
        import json

        from distdoctor.findings import write_findings

        ours = host.startswith("(")  # the collector's own (digests, lost nodes, links)
        size = len(json.dumps([f.to_json() for f in findings], default=str))
        if size > MAX_FINDINGS_BYTES_PER_NODE and not ours:
            raise wire.WireError(f"FINDINGS frame of {size:,} bytes of findings (a node "
                                 f"holds at most {MAX_FINDINGS_BYTES_PER_NODE:,})")
        with self._lock:
            if host not in self._findings and len(self._findings) >= MAX_HOSTS:
                raise wire.WireError(f"the collector holds {MAX_HOSTS:,} nodes' findings")
            held = sum(self._findings_bytes.values()) - self._findings_bytes.get(host, 0)
            if ours:
                findings, size = _within(findings, min(MAX_FINDINGS_BYTES_PER_NODE,
                                                       MAX_FINDINGS_BYTES - held))
            if not ours:  # full: the nodes holding more than this one would go
                for other in who_goes(self._findings_bytes, host,
                                      size - self._findings_bytes.get(host, 0),
                                      MAX_FINDINGS_BYTES, "bytes of the nodes' findings"):
                    n = self._findings_bytes.pop(other)
                    del self._findings[other]
                    held -= n
                    self.evicted[other] = gone_line(n, MAX_FINDINGS_BYTES,
                                                    "bytes of the nodes' findings", host)
            if held + size > MAX_FINDINGS_BYTES:
                raise wire.WireError(f"the collector holds {held:,} bytes of the nodes' "
                                     f"findings already (at most {MAX_FINDINGS_BYTES:,})")
            new = [f for f in findings if (host, _ident(f)) not in self._told
                   and (None, _ident(f)) not in self._told]
            if self._told_by.get(host, 0) + len(new) > MAX_NEW_FINDINGS and not host.startswith("("):
                raise wire.WireError(f"more than {MAX_NEW_FINDINGS:,} findings from one node")
            self._told_by[host] = self._told_by.get(host, 0) + len(new)
            self._told.update((host, _ident(f)) for f in new)
            self._findings[host] = findings
            self._findings_bytes[host] = size
            now = {_ident(f) for h, fs in self._findings.items() if h != EARLIER for f in fs}
            write_findings(self.run_dir, [f for h in sorted(self._findings)
                                          for f in self._findings[h]
                                          if h != EARLIER or _ident(f) not in now])
        if self.on_finding is not None:
            for f in new:
                if _seen_from_a_receiver(f):
                    continue  # in findings.json: the collector names the culprit itself
                self.on_finding(f)

    def close(self) -> None:
        self.copies.close()
        self.sources.close()

    def lost_node(self, node: NodeMirror) -> None:
        """A node whose stream ended without its exit codes: its ranks written as gone
        (copy_exits.py)."""
        with self._lock:
            self.exits.lost(node.host, [r for r in node.ranks
                                        if self.owners.of.get(r) == node.host])

    def add_exits(self, processes: list[dict]) -> None:
        """Checked entries (peer_data.node_exits) of ranks their node owns (claimed)."""
        with self._lock:
            self.exits.add(processes)


def _earlier_findings(run_dir: Path) -> dict[str, list]:
    from distdoctor.findings import read_findings

    try:
        found = read_findings(run_dir)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}
    return {EARLIER: found[:MAX_HOSTS]} if found else {}


def _within(findings: list, limit: int) -> tuple[list, int]:
    """The collector's own findings that fit in `limit` bytes of findings.json, most
    severe first, and their size. All or none, a network split of hundreds of nodes (a
    lost-node finding each) wrote none of them, nor any finding of the digests after."""
    import json

    from distdoctor.findings import most_severe_first

    kept, size = [], 2
    for f in most_severe_first(findings):
        n = len(json.dumps(f.to_json(), default=str)) + 2
        if size + n <= limit:
            kept.append(f)
            size += n
    return (findings, size) if len(kept) == len(findings) else (kept, size)


def _ident(f) -> tuple:
    """What makes a finding news: its summary (two errors of one rank in the job's output
    are two), but a straggler's summary moves with its numbers: its ranks."""
    return f.key if f.kind == "straggler" else (f.summary,)


def _seen_from_a_receiver(f) -> bool:
    """A mismatch a node's job output told with no culprit (gloo's "received more than
    the buffer holds", printed by the rank that received): the collector, which sees every
    node's ops, announces the traced mismatch that names the rank instead."""
    return f.kind == "mismatch" and not f.ranks and f.details.get("source") == "log"
