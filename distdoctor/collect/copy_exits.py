"""exits.json of the collector's copy: each rank's exit code as its owner sent it (a node's
EXITS frame, peer_data.node_exits), or the node it was lost with when that node's stream
ended without them.

A rank its owner sent an exit code for is finished: that code is the last word of its
launch while its owner is connected (claims.py sets another host's claim aside unless it is
of a newer launch, an elastic restart, or the owner has left: a re-run on a spare host;
then the new owner's exit code replaces it).
A "lost with node" entry is no such word: the node's replacement sends the real one.
Started again on its copy, the collector reads the entries a collector before it wrote,
so a rank finished before stays finished, and the launch it finished (what a relaunch is
newer than) is read from its newest log in the copy.
"""

from __future__ import annotations

from pathlib import Path

from distdoctor.collect.limits import MAX_RANKS
from distdoctor.runlog.rundir import write_json_atomic


class CopyExits:
    """rank -> its exit entry (called under the Mirror's lock)."""

    def __init__(self, run_dir: Path):
        self.path = run_dir / "exits.json"
        self.entries: dict[int, dict] = _earlier_exits(self.path)
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
        """Checked entries (peer_data.node_exits) of ranks their node owns (claimed)."""
        changed = False
        for p in processes:
            if self.entries.get(p["rank"]) != p:
                self.entries[p["rank"]] = p
                changed = True
        if changed:
            self._write()

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
