"""exits.json of the collector's copy: each rank's exit code as its owner sent it (a node's
EXITS frame, peer_data.node_exits), or the node it was lost with when that node's stream
ended without them.

A rank its owner sent an exit code for is finished: that code is the last word of its
launch while its owner is connected (claims.py sets another host's claim aside unless it is
of a newer launch, an elastic restart, or the owner has left: a re-run on a spare host;
then the new owner's exit code is the rank's entry).
The entry it replaces is kept, with the host that sent it, in exits-earlier.json: the wire
cannot tell a re-run on a spare host from a peer that claims a finished rank and sends
any exit code for it, and the user who reads the copy afterwards needs the first run's
word either way (the failure they diagnose, or the rank that finished before a false
claim said it was killed). Kept per rank: its first replaced entry, the first real exit
record, which no later claim moves, and the newest replaced one (the re-run's, where a
claim came after it): at most two, so the file stays within what exits.json may hold,
and exits.json keeps one entry per rank for every reader that reads it.
A "lost with node" entry is no such word: the node's replacement sends the real one.
Started again on its copy, the collector reads the entries a collector before it wrote,
so a rank finished before stays finished, and the launch it finished (what a relaunch is
newer than) is read from its newest log in the copy.
"""

from __future__ import annotations

from pathlib import Path

from distdoctor.collect.limits import MAX_RANKS
from distdoctor.runlog.rundir import write_json_atomic

EARLIER_FILE = "exits-earlier.json"  # finished ranks' entries other hosts' replaced
MAX_REPLACED = 2  # a rank's replaced entries kept: its first, and the newest after it
MAX_HOST = 253  # a host name's length (node_mirror.HOST_NAME)


class CopyExits:
    """rank -> its exit entry, and the entries other hosts' replaced (called under the
    Mirror's lock). `owners` (owners.Owners) says which host sent an entry: the rank's
    owner as its EXITS frame is taken (only owners' entries are added)."""

    def __init__(self, run_dir: Path, owners=None):
        self.path = run_dir / "exits.json"
        self.earlier_path = run_dir / EARLIER_FILE
        self.owners = owners
        self.entries: dict[int, dict] = _earlier_exits(self.path)
        of = owners.of if owners is not None else {}
        self.hosts: dict[int, str | None] = {r: of.get(r) for r in self.entries}
        self.earlier: dict[int, list[dict]] = _replaced_exits(self.earlier_path)
        self._looked: set[int] = set()  # finished ranks whose launch was read (launch_of)

    def finished(self, rank: int) -> bool:
        """Whether `rank`'s owner sent its exit code (not a node lost with it)."""
        entry = self.entries.get(rank)
        return entry is not None and entry.get("lost_with_node") is None

    def launch_of(self, rank: int, path: Path) -> tuple | None:
        """The launch (owners.incarnation) of the log at `path`, the newest of a finished
        `rank` in the copy, read once a rank (None: none, or not a log)."""
        from distdoctor.collect.owners import incarnation
        from distdoctor.runlog.reader import RankLog

        if rank in self._looked or not self.finished(rank):
            return None
        self._looked.add(rank)
        try:
            log = RankLog(path)
        except Exception:  # (a file any reader refuses: no launch known)
            return None
        try:
            return incarnation(log.launch)
        finally:
            log.close()

    def add(self, processes: list[dict]) -> None:
        """Checked entries (peer_data.node_exits) of ranks their node owns (claimed); a
        finished rank's entry from another host is kept as replaced (_keep)."""
        changed = replaced = False
        for p in processes:
            rank, old = p["rank"], self.entries.get(p["rank"])
            if old == p:
                continue
            host = self.owners.of.get(rank) if self.owners is not None else None
            if old is not None and old.get("lost_with_node") is None \
                    and self.hosts.get(rank) != host:
                replaced = self._keep(rank, old, host) or replaced
            self.entries[rank], self.hosts[rank] = p, host
            changed = True
        if changed:
            self._write()
        if replaced:
            self._write_earlier()

    def _keep(self, rank: int, old: dict, by: str | None) -> bool:
        """`rank`'s entry `old` replaced by host `by`'s: kept as the first replaced (for
        good) or as the newest replaced one after it."""
        kept = self.earlier.setdefault(rank, [])
        item = {**old, "host": self.hosts.get(rank), "replaced_by": by}
        if len(kept) < MAX_REPLACED:
            kept.append(item)
        else:
            kept[-1] = item
        return True

    def unlost(self, rank: int, host: str) -> None:
        """`rank`'s entry as lost with `host` dropped: the rank was never host's (a claim
        shown false, claims.py), and its owner goes on running it."""
        entry = self.entries.get(rank)
        if entry is not None and entry.get("lost_with_node") == host:
            del self.entries[rank]
            self._write()

    def _write(self) -> None:
        write_json_atomic(self.path, {
            "stopped_by_distdoctor": any(p.get("stopped_by_distdoctor")
                                         for p in self.entries.values()),
            "processes": [self.entries[r] for r in sorted(self.entries)]}, indent=None)

    def _write_earlier(self) -> None:
        write_json_atomic(self.earlier_path, {"processes": [
            p for r in sorted(self.earlier) for p in self.earlier[r]]}, indent=None)

    def lost(self, host: str, ranks) -> None:
        """`host`'s stream ended without its exit codes: its ranks (those it owns) are
        written as gone, so a post-mortem of the copy takes their unclosed logs for dead
        ranks, as the live view did. A node that comes back sends its real ones."""
        self.add([{"rank": r, "pid": None, "exit_code": None, "signal": None,
                   "stopped_by_distdoctor": False, "lost_with_node": host}
                  for r in sorted(ranks) if r not in self.entries])


def _earlier_exits(path: Path) -> dict[int, dict]:
    """exits.json's entries as a collector before us wrote them (those still sound)."""
    from distdoctor.exits import read_exit_entries

    try:
        _, entries, _ = read_exit_entries(path)
    except (OSError, ValueError):
        return {}
    return {p["rank"]: p for p in entries[:MAX_RANKS] if p["rank"] is not None}


def _replaced_exits(path: Path) -> dict[int, list[dict]]:
    """exits-earlier.json's entries as a collector before us wrote them (the sound ones,
    MAX_REPLACED a rank, MAX_RANKS ranks)."""
    from distdoctor.exits import MAX_EXITS_BYTES, exit_entry
    from distdoctor.privatefiles import read_json
    from distdoctor.safetext import printable

    try:
        data = read_json(path, MAX_EXITS_BYTES)
    except (OSError, ValueError):
        return {}
    processes = data.get("processes") if isinstance(data, dict) else None
    out: dict[int, list[dict]] = {}
    for p in processes if isinstance(processes, list) else ():
        entry = exit_entry(p)
        if entry is None or entry["rank"] is None:
            continue
        kept = out.get(entry["rank"])
        if kept is None and len(out) >= MAX_RANKS or kept is not None \
                and len(kept) >= MAX_REPLACED:
            continue
        for key in ("host", "replaced_by"):
            value = p.get(key)
            entry[key] = printable(value, MAX_HOST) if isinstance(value, str) else None
        out.setdefault(entry["rank"], []).append(entry)
    return out
