"""A whole run read back: metadata plus every rank's events, per incarnation."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from distdoctor.errors import UserError
from distdoctor.runlog import format as F
from distdoctor.runlog.incarnations import Incarnations
from distdoctor.runlog.reader import Event, RankLog, RingHeader
from distdoctor.runlog.rundir import (
    RunInfo,
    open_run_dir,
    rank_meta_at,
    rank_meta_path,
    ring_path,
)


@dataclass
class Run:
    """One incarnation of a run (the ranks of one launch; most runs have one)."""

    info: RunInfo
    incarnation: int = 0
    incarnations: int = 1  # how many the run dir holds
    events: dict[int, list[Event]] = field(default_factory=dict)  # ops and spans
    # where each rank's main thread was between ops (tracer/steps.py's sampler)
    stack_samples: dict[int, list[Event]] = field(default_factory=dict)
    headers: dict[int, RingHeader] = field(default_factory=dict)
    unreadable: dict[int, str] = field(default_factory=dict)  # rank -> why
    meta: dict[int, dict] = field(default_factory=dict)  # rank -> its log's metadata
    log_numbers: dict[int, int] = field(default_factory=dict)  # rank -> its log's number

    @property
    def path(self) -> Path:
        return self.info.path

    @property
    def label(self) -> str:
        """How front ends name this incarnation ("" when the run has only one)."""
        return f"incarnation {self.incarnation}" if self.incarnations > 1 else ""

    @property
    def world_size(self) -> int | None:
        """The ranks' word (their metadata, checked: rundir.MAX_WORLD_SIZE at most), else
        run.json's."""
        sizes = [m.get("world_size") for m in self.meta.values()]
        ws = max((s for s in sizes if isinstance(s, int)), default=None)
        return self.info.world_size if ws is None else ws

    def span_names(self, rank: int) -> dict[int, str]:
        """span_index (event number + 1) -> span name, for this rank."""
        return {e.index + 1: span_name(e) for e in self.events.get(rank, ())
                if e.kind == "span"}


def read_incarnations(path=None, ranks: list[int] | None = None) -> list[Run]:
    """Every incarnation of a run dir, in order (one, empty, for a run with no logs). A
    rank log that is unreadable is reported in the incarnation of its number, not fatal."""
    info = open_run_dir(path)
    logs: list[tuple[int, int, int, RankLog]] = []  # (made, number, rank, log)
    lost: list[tuple[int, int, str]] = []
    for rank, numbers in info.logs.items():  # every rank's: they number the incarnations
        for n in numbers:
            try:
                log = RankLog(ring_path(info.path, rank, n))
            except UserError as exc:
                lost.append((rank, n, str(exc)))
                continue
            if log.rank != rank:  # a copied or crafted file: its events would be misplaced
                lost.append((rank, n, f"{ring_path(info.path, rank, n).name} says it is rank "
                                      f"{log.rank}: not this rank's log; left out"))
                log.close()
                continue
            logs.append((log.created_wall_ns, n, rank, log))
    numbering = Incarnations()
    placed = [(numbering.assign(rank, log.launch), rank, n, log)
              for _, n, rank, log in sorted(logs, key=lambda t: t[:3])]
    runs = [Run(info, i, max(1, numbering.count)) for i in range(max(1, numbering.count))]
    for i, rank, n, log in placed:
        run = runs[i]
        if ranks is not None and rank not in ranks:
            log.close()
            continue
        try:
            run.headers[rank] = log.header()
            events = log.read()
            run.events[rank] = [e for e in events if e.kind != "sample"]
            run.stack_samples[rank] = [e for e in events if e.kind == "sample"]
            run.meta[rank], note = rank_meta_at(rank_meta_path(info.path, rank, n))
            if note and note not in info.notes:  # (a rank's first log's: said already)
                info.notes.append(note)
            run.log_numbers[rank] = n
        except UserError as exc:
            run.unreadable[rank] = str(exc)
        finally:
            log.close()
    for rank, n, why in lost:
        if ranks is None or rank in ranks:
            runs[min(n, len(runs) - 1)].unreadable[rank] = why
    return runs


def read_run(path=None, ranks: list[int] | None = None,
             incarnation: int | None = None) -> Run:
    """One incarnation of a run dir: the given one, or the newest."""
    runs = read_incarnations(path, ranks)
    if incarnation is None:
        return runs[-1]
    if not 0 <= incarnation < len(runs):
        raise UserError(f"{runs[0].path} holds incarnation(s) 0-{len(runs) - 1}, "
                        f"not {incarnation}")
    return runs[incarnation]


SUMMARY_RANKS = 16  # ranks the summary line shows


def traced_summary(path) -> str:
    """One line on what a run dir holds, from the logs' headers only (cheap at the end of
    a long job): "2 rank(s) traced in 5 incarnations (r0:505 r1:505)", events per rank
    ("unreadable" where no log of the rank could be read), the first SUMMARY_RANKS of
    them. Ranks whose logs are all unreadable (a log its rank shrank, junk at a log name)
    are counted apart: 10,000 junk files are no 10,000 ranks traced."""
    info = open_run_dir(path)
    numbering = Incarnations()
    counts, unreadable = [], 0
    for rank, numbers in info.logs.items():
        total = None
        for n in numbers:
            try:
                log = RankLog(ring_path(info.path, rank, n))
            except UserError:
                continue
            try:
                numbering.assign(rank, log.launch)
                total = (total or 0) + log.header().head
            except UserError:
                pass
            finally:
                log.close()
        unreadable += total is None
        counts.append(f"r{rank}:{'unreadable' if total is None else total}")
    times = f" in {numbering.count} incarnations" if numbering.count > 1 else ""
    shown = " ".join(counts[:SUMMARY_RANKS]) + (
        f" and {len(counts) - SUMMARY_RANKS} more" if len(counts) > SUMMARY_RANKS else "")
    apart = f"; {unreadable} rank(s) with no readable log" if unreadable else ""
    return f"{len(counts) - unreadable} rank(s) traced{times} ({shown or 'no events'}){apart}"


def span_name(ev) -> str:
    """A span's name as shown: the tracer's implicit steps carry their number in `seq`."""
    if ev.implicit and ev.name and ev.name not in ("data", F.SPAN_NEW_GROUP):
        # "step 12", "batch 3", "global_step 25 (HF Trainer)": the count, its number, whose
        head, _, whose = ev.name.partition(" ")
        return f"{head} {ev.seq}" + (f" {whose}" if whose else "")
    return ev.name or "span"
