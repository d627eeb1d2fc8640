"""A whole run read back: metadata plus every rank's events."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from distdoctor.errors import UserError
from distdoctor.runlog.reader import Event, RankLog, RingHeader
from distdoctor.runlog.rundir import RunInfo, open_run_dir, ring_path


@dataclass
class Run:
    info: RunInfo
    events: dict[int, list[Event]] = field(default_factory=dict)
    headers: dict[int, RingHeader] = field(default_factory=dict)
    unreadable: dict[int, str] = field(default_factory=dict)  # rank -> why

    @property
    def path(self) -> Path:
        return self.info.path

    @property
    def world_size(self) -> int | None:
        ws = self.info.meta.get("world_size")
        if isinstance(ws, int):
            return ws
        sizes = [m.get("world_size") for m in self.info.ranks.values()]
        return max((s for s in sizes if isinstance(s, int)), default=None)

    def span_names(self, rank: int) -> dict[int, str]:
        """span_index (event number + 1) -> span name, for this rank."""
        return {e.index + 1: e.name or "span" for e in self.events.get(rank, ())
                if e.kind == "span"}


def read_run(path=None, ranks: list[int] | None = None) -> Run:
    """Read a run dir; a rank whose log is unreadable is reported, not fatal."""
    info = open_run_dir(path)
    run = Run(info)
    for rank in info.ring_ranks:
        if ranks is not None and rank not in ranks:
            continue
        try:
            log = RankLog(ring_path(info.path, rank))
        except UserError as exc:
            run.unreadable[rank] = str(exc)
            continue
        try:
            run.headers[rank] = log.header()
            run.events[rank] = log.read()
        finally:
            log.close()
    return run
