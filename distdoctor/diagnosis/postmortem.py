"""Post-mortem diagnosis of a finished (or still running) run directory."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from distdoctor.diagnosis.crashes.crash import ExitInfo, merge_crashes
from distdoctor.diagnosis.engine.boundary import exception_text, internal_finding, where_raised
from distdoctor.diagnosis.engine.core import Engine
from distdoctor.diagnosis.hangs.group_order import GROUP_CAUSES
from distdoctor.diagnosis.hangs.progress import hang_timeout_s as timeout_of
from distdoctor.diagnosis.mismatches.after_mismatch import alloc_in_mismatch
from distdoctor.diagnosis.report import rank_ranges
from distdoctor.findings import (
    FINDINGS_FILE,
    Finding,
    merge_findings,
    most_severe_first,
    read_findings,
)
from distdoctor.runlog.run import Run
from distdoctor.runlog.rundir import why_unreadable

HEARTBEAT_SLACK_S = 1.5


def _live_findings(run_dir: Path, notes: list[str]) -> list[Finding]:
    """What the live engine wrote: it alone has the stacks of ranks that were alive."""
    try:
        return read_findings(run_dir)
    except (OSError, ValueError) as exc:
        notes.append(f"{run_dir / FINDINGS_FILE} is unreadable{_refused(exc)}; live findings "
                     f"(and their stacks) are lost")
        return []


def read_exits(run_dir: Path) -> tuple[dict[int, ExitInfo], list[str]]:
    """Exit codes from RUN_DIR/exits.json (written by `distdoctor run` when the job ends);
    an entry that is not sound is skipped, the others kept (distdoctor.exits)."""
    from distdoctor.exits import read_exit_entries

    path = run_dir / "exits.json"
    if not path.exists():
        return {}, []
    try:
        flags, entries, skipped = read_exit_entries(path)
    except (OSError, ValueError) as exc:
        return {}, [f"{path} is unreadable{_refused(exc)}: process exit codes unknown"]
    notes = ([f"`distdoctor run` died before the job ended (killed?); its guardian "
              f"stopped the job's processes ({path})"] if flags["run_died"] else [])
    if skipped:
        notes.append(f"{path}: {skipped} process entr{'y' if skipped == 1 else 'ies'} "
                     f"unreadable, skipped; the others' exit codes kept")
    # a rank stopped with its launcher has no exit code of its own (exit_code null)
    return ({p["rank"]: ExitInfo(p["exit_code"],
                                 "stopped" if p["stopped_by_distdoctor"] else "exit")
             for p in entries if p["rank"] is not None
             and (p["exit_code"] is not None or p["stopped_by_distdoctor"])}, notes)


def _refused(exc: Exception) -> str:
    """Why a file of the run dir was not read, where it was refused for what it is (a
    FIFO, a link, its size: privatefiles.read_json); "" for one that is no sound JSON."""
    return f" ({why_unreadable(exc)})" if isinstance(exc, OSError) else ""


def _samples(run_dir: Path, notes: list[str]) -> list:
    try:
        from distdoctor.probes.sampler import read_samples
    except ImportError:
        return []
    try:
        return read_samples(run_dir)
    except Exception as exc:  # a corrupt probe file loses the throttle findings only
        notes.append(f"probe samples unreadable ({exc}); throttling unknown")
        return []


ONSET_CHECKS = 50  # straggler verdicts taken while the events go in (see diagnose_events)


def diagnose_events(events: dict[int, list], headers: dict, exits: dict[int, ExitInfo],
                    hang_timeout_s: float | None, samples: list = (),
                    members_per_op: bool = False) -> Engine:
    """Run every detector over complete event streams (clocks stop at the last heartbeat).

    `hang_timeout_s`: None decides hangs by progress (the sampled lines in the log, as
    there are no readings of the processes post-mortem), a number by that fixed rule. A
    rank's clock is known only up to its last heartbeat (one a second), so a wait that
    the live engine saw pass the timeout may end a heartbeat short of it here.
    `members_per_op`: the events' group_ranks are the members expected at each op (the
    Flight Recorder's dumps), not their group's members.
    """
    from distdoctor.diagnosis.live import gpu_findings_fn

    engine = Engine(None if hang_timeout_s is None
                    else max(0.0, hang_timeout_s - HEARTBEAT_SLACK_S), postmortem=True)
    engine.samples.extend(samples)
    # members expected at each op (the Flight Recorder's), not the group's: two member
    # lists for one name are then no sign of groups created in different orders
    engine.group_names.off = members_per_op
    engine.gpu_findings = gpu_findings_fn()
    every = max(100, sum(map(len, events.values())) // ONSET_CHECKS)
    for evs in events.values():
        for at in range(0, len(evs), every):
            engine.ingest(evs[at:at + every], 0.0)
            # the straggler verdict looks at a window of recent steps; judged now and
            # then (as live), a straggler's onset is found before the window slides past
            engine.straggler.findings()
    for rank, header in headers.items():
        engine.heartbeat(rank, header.heartbeat_mono_ns, 0.0)
        if header.closed and (rank not in exits or header.exit_call or header.exception):
            # then the launcher's word, if any: it keeps the line of the log's exit call
            # and the raise the log saw
            engine.exited(rank, ExitInfo.of_closed_log(header))
    for rank, info in exits.items():
        engine.exited(rank, info)
    engine.tick(None, final=True)
    return engine


def diagnose_runs(runs: list[Run], hang_timeout_s: float | None = None
                  ) -> tuple[list[Finding], list[str]]:
    """Findings of every incarnation of a run (each on its own: ranks of one launch are
    never compared with another's), labelled when there are several, merged with what
    the live engine wrote; and notes on what is unknown."""
    from distdoctor.diagnosis.live import label_incarnation

    several = len(runs) > 1
    findings: list[Finding] = []
    notes: list[str] = []
    completed: set = set()
    newest = {r: run.incarnation for run in runs for r in run.events}  # rank -> newest
    for run in runs:
        found, run_notes = _contained(run, hang_timeout_s, newest, completed)
        if several:
            found = [label_incarnation(f, run.incarnation) for f in found]
            run_notes = [f"{run.label}: {n}" for n in run_notes]
        findings += found
        notes += [n for n in run_notes if n not in notes]
    ranks = {r for run in runs for r in run.events}
    findings = most_severe_first(merge_crashes(agree_with_live(
        findings, _live_findings(runs[0].path, notes), completed), ranks))
    return findings, notes + _file_notes(runs[0], notes) + _source_notes(runs[0].path, notes,
                                                                         findings)


def diagnose_run(run: Run, hang_timeout_s: float | None = None) -> tuple[list[Finding], list[str]]:
    """Findings of one incarnation (most runs have only one), merged with the live ones
    of the same incarnation."""
    from distdoctor.diagnosis.live import label_incarnation

    completed: set = set()
    found, notes = _contained(run, hang_timeout_s, {r: run.incarnation for r in run.events},
                              completed)
    written = _live_findings(run.path, notes)
    if run.incarnations > 1:
        found = [label_incarnation(f, run.incarnation) for f in found]
        written = [f for f in written if f.details.get("incarnation") == run.incarnation]
    findings = most_severe_first(merge_crashes(agree_with_live(found, written, completed),
                                               set(run.events)))
    return findings, notes + _file_notes(run, notes) + _source_notes(run.path, notes, findings)


def _file_notes(run: Run, notes: list[str]) -> list[str]:
    """What the run dir's metadata files lost (rundir.rank_meta_at), said once each."""
    return [n for n in run.info.notes if n not in notes]


def _source_notes(run_dir: Path, notes: list[str], findings: list[Finding]) -> list[str]:
    """Source files that changed since the run, said once each: those the diagnosis read
    (from the run's copy, or not at all) and those the findings name (their lines are
    the run's)."""
    from distdoctor.runlog.kept import attach

    kept = attach(run_dir)
    for path in sorted({c.get("file") for f in findings for c in f.callsites
                        if isinstance(c.get("file"), str)}):
        kept.text(path)  # (the note, where the file on disk is not the run's)
    return [n for n in kept.notes if n not in notes]


def agree_with_live(found: list[Finding], written: list[Finding],
                    completed: set) -> list[Finding]:
    """The recomputed findings merged with the live ones. A wait that completed in the
    log (`completed`: (incarnation, group, seq)) is never a hang, whatever was written
    while it was in flight; a wait the live engine saw as a long wait (it had the busy
    rank's CPU and I/O, which the log lacks) stays one."""
    def where(f: Finding) -> tuple:
        return f.details.get("incarnation"), f.group, f.seq

    written = [f for f in written if not (f.kind in ("hang", "deadlock")
                                          and f.seq is not None and where(f) in completed)]
    # a rank the live engine saw computing when the job's timeout fired: the log's
    # "never arrived" on it is that straggler (slow_past_timeout.py)
    slow = {r for f in (*found, *written) if f.details.get("reason") == "timeout_while_busy"
            for r in f.ranks}
    written = [f for f in written if not (f.kind == "hang" and f.ranks and set(f.ranks) <= slow
                                          and f.details.get("source") == "log")]
    # groups created in different orders: where the live engine saw the ranks stuck, the
    # log (which lacks their last seconds) may say the same cause as a mismatch: one cause
    stuck = {f.details.get("incarnation") for f in written if f.kind == "hang"
             and f.details.get("reason") in GROUP_CAUSES}
    found = [f for f in found if not (f.kind == "mismatch" and f.details.get("reason")
                                      in GROUP_CAUSES and f.details.get("incarnation") in stuck)]
    long_live = {where(f) for f in written if f.kind == "long_wait"}
    found = [f for f in found if not (f.kind == "hang" and f.seq is not None
                                      and where(f) in long_live)]
    return merge_findings(found, _after_traced_mismatch(written, found))


def _after_traced_mismatch(written: list[Finding], found: list[Finding]) -> list[Finding]:
    """What the job printed of a mismatch the traces now explain (a live engine that
    stopped early wrote them before the traced mismatch was known): consequences."""
    # a tie explains them as well as a culprit does: the sizes disagreed either way
    traced = [f for f in found if f.kind == "mismatch" and f.details.get("source") != "log"
              and (f.ranks or f.details.get("tie"))]
    if not traced:
        return written
    died_in = {f.ranks[0]: (f.group, f.seq) for f in found
               if f.kind == "crash" and len(f.ranks) == 1 and f.seq is not None}
    out = []
    for f in written:
        if f.details.get("source") == "log" and f.severity == "error" and (
                f.kind == "mismatch" and not f.ranks):
            f = replace(f, severity="warning",
                        details={**f.details, "consequence_of_mismatch": True})
        out.append(alloc_in_mismatch(f, traced, died_in.get) or f)
    return out


def _contained(run: Run, hang_timeout_s, newest: dict[int, int],
               completed: set) -> tuple[list[Finding], list[str]]:
    """_diagnose_one, where a failure outside the detectors' own boundary (engine/boundary.py)
    loses that incarnation's recomputed findings, never the others' nor the live ones:
    said as an internal finding and a note."""
    try:
        return _diagnose_one(run, hang_timeout_s, newest, completed)
    except Exception as exc:  # the doctor does not die (DESIGN principle 9)
        f = internal_finding("post-mortem", exc, where_raised(exc), 1, False,
                             part="post-mortem diagnosis of this run",
                             then="what the live engine wrote is shown")
        return [f], [f"the traces could not be diagnosed: {exception_text(exc)} (a bug in "
                     f"distdoctor); the findings the live engine wrote are shown"]


def _diagnose_one(run: Run, hang_timeout_s: float | str | None, newest: dict[int, int],
                  completed: set) -> tuple[list[Finding], list[str]]:
    """`completed` receives the (incarnation, group, seq) of every collective that
    completed in this incarnation's logs."""
    hang_timeout_s = timeout_of(hang_timeout_s, run.info.hang_timeout_s)
    all_exits, notes = read_exits(run.path)
    # exits.json has each process's last exit: a rank's belongs to its newest incarnation
    exits = {r: e for r, e in all_exits.items() if newest.get(r) == run.incarnation}
    if (run.path / "exits.json").exists() or run.incarnation < max(newest.values(),
                                                                  default=0):
        for rank, header in run.headers.items():  # this launch is over: unclosed died
            if rank not in exits and not header.closed:
                exits[rank] = ExitInfo(None, "vanished")
    last = run.incarnation == max(newest.values(), default=0)
    # each rank's samples in its own order among its ops: where it was between them
    engine = diagnose_events({r: sorted(evs + run.stack_samples.get(r, []),
                                        key=lambda e: e.index)
                              for r, evs in run.events.items()}, run.headers, exits,
                             hang_timeout_s,
                             samples=_samples(run.path, notes) if last else ())
    findings = engine.findings()
    label = run.incarnation if run.incarnations > 1 else None
    still_open = {(rv.group, rv.seq) for rv in engine.open.values()}
    completed.update((label, ev.group, ev.seq) for evs in run.events.values() for ev in evs
                     if ev.kind == "collective" and ev.t_end_ns is not None
                     and (ev.group, ev.seq) not in still_open)
    if not findings:
        notes += _unfinished(engine.open.values())
    unreadable = sorted(run.unreadable.items())
    for rank, why in unreadable[:UNREADABLE_SHOWN]:
        notes.append(f"rank {rank}: {why}; its part is unknown")
    if len(unreadable) > UNREADABLE_SHOWN:  # (10,000 junk files were 10,000 notes)
        rest = [rank for rank, _ in unreadable[UNREADABLE_SHOWN:]]
        notes.append(f"rank(s) {rank_ranges(rest)}: {len(rest)} more event logs not read "
                     f"either; their part is unknown")
    ws = run.world_size  # (rundir.MAX_WORLD_SIZE at most)
    if ws:
        absent = [r for r in range(ws) if r not in run.events and r not in run.unreadable]
        if absent:
            notes.append(f"rank(s) {rank_ranges(absent)} left no event log (never "
                         f"started, or died before initialising torch.distributed)")
    for rank, h in sorted(run.headers.items()):
        if h.unrecorded:
            notes.append(f"rank {rank}: {h.unrecorded} events were not recorded (the disk "
                         f"under the run dir was full); findings about them are unknown")
        if h.dropped:
            notes.append(f"rank {rank}: its oldest {h.dropped} events were overwritten (ring "
                         f"full); findings about them are unknown")
    return findings, notes


UNFINISHED_SHOWN = 3  # ops left in flight at the end, named in notes
UNREADABLE_SHOWN = 8  # rank logs not read, each named in notes; the rest in one line


def _unfinished(open_rvs) -> list[str]:
    """Ops still in flight when the ranks' logs end, which no finding explains (the wait
    was too short for a hang, or the job ended inside them): said, so that "no findings"
    never reads as "everything completed"."""
    left = [rv for rv in open_rvs if any(e.t_end_ns is None for e in rv.arrivals.values())]
    out = []
    for rv in left[:UNFINISHED_SHOWN]:
        inside = sorted(r for r, e in rv.arrivals.items() if e.t_end_ns is None)
        missing = rv.missing
        never = (f"; rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} "
                 "never joined it") if missing else ""
        out.append(f"{rv.label()} never completed: rank{'s' if len(inside) > 1 else ''} "
                   f"{', '.join(map(str, inside))} {'were' if len(inside) > 1 else 'was'} "
                   f"still in it when the logs end{never} (the wait was too short to "
                   "call a hang)")
    if len(left) > UNFINISHED_SHOWN:
        out.append(f"... and {len(left) - UNFINISHED_SHOWN} more ops left in flight")
    return out
