"""From signals to findings: the first failure is the cause, the rest its consequences, one
finding per problem whatever the number of ranks printing it.

The order of judgement:
1. Causes: exceptions, OOMs, NCCL/store/DDP/mismatch errors, and exits a launcher reports
   with no cause of their own (a SIGKILL with no traceback: the host's OOM killer).
2. Timeouts (ranks that waited): explained by a cause on a rank that did not report the
   timeout, or one the log shows before it; else by the rank the message names (a store key's
   writer); else by the rank behind (its last enqueued work is before the timed-out one); else
   by a rank the log shows still busy (serial work) or still running when the launcher stopped
   it; else by absence, only where the log shows the whole world and that rank's other lines;
   else the finding says what would settle it.
3. Victims (a peer left, the store went away): consequences of a cause; alone, they name the
   rank that left when the launcher's report shows it, and never blame the one who saw it.

What each family's problems mean (their words) lives with the family (families/).
"""

from __future__ import annotations

import math
import re

from distdoctor.findings import Finding
from distdoctor.logs import remedies as R
from distdoctor.logs.aftermath import said_beside, store_after_peers_lost
from distdoctor.logs.bounds import every_rank
from distdoctor.logs.desync import fold_stuck_ranks, one_unexplained_watchdog
from distdoctor.logs.exits import (
    exit_findings,
    orphans_to_root_cause,
    raised_reports_to_their_rank,
)
from distdoctor.logs.fallback import fallback_cause
from distdoctor.logs.families import MEANINGS
from distdoctor.logs.families.launcher import collect_exits
from distdoctor.logs.problems import (
    Evidence,
    Problem,
    clip,
    make_finding,
    pg_of,
    plural,
    problem_key,
    ranks_text,
)
from distdoctor.logs.restarts import fold_restarts
from distdoctor.logs.signals import (
    BENIGN,
    CAUSE,
    CONTEXT,
    EXIT,
    TEARDOWN,
    TIMEOUT,
    UNKNOWN,
    VICTIM,
    Signal,
)
from distdoctor.logs.transport import transport_to_crash

_SEVERITY = {"error": 0, "warning": 1, "info": 2}


class Reasoner:
    """The whole log's signals, judged together (the `ctx` families describe against)."""

    def __init__(self, signals: list[Signal], activity: dict, known_ranks: set[int] = frozenset(),
                 progress: dict | None = None, file_lines: dict | None = None):
        self.ev = Evidence(signals, activity, known_ranks)
        self.file_lines = file_lines or {}
        self.unknown: list[Signal] = []  # error lines no family knows (fallback.py)
        self.restarts = [s for s in signals if s.rule in ("restart", "membership")]
        # live under `run`: the launcher's own ranks are known, and their exits are seen by the
        # engine itself (not printed in the output this scanner reads)
        self.live = bool(known_ranks)
        self.mid_run = False  # the log starts mid-run: a rank it does not show proves nothing
        self.progress = progress or {}
        self.problems: dict[tuple, Problem] = {}
        self._context: dict[tuple, dict] = {}
        self._by_order = {s.order: s for s in signals}
        # each finding's first line (by id), for where it falls in the job's story (story.py)
        self.first_lines: dict[int, object] = {}
        exits, teardown_pids = [], set()
        for s in signals:
            if s.role == CONTEXT:
                self._context.setdefault((s.rule, s.fields.get("rank")), {}).update(s.fields)
                continue
            if s.role == EXIT:
                exits.append(s)
                continue
            if s.role == UNKNOWN:
                if not s.fields.get("known"):  # (a family read its what() line)
                    self.unknown.append(s)
                continue
            if s.role == TEARDOWN and "pid" in s.fields:
                teardown_pids.add(s.fields["pid"])
            key = problem_key(s)
            p = self.problems.get(key)
            if p is None:
                p = self.problems[key] = Problem(s.family, s.rule, s.role, key)
            p.add(s)
        by_host: dict[str, set[int]] = {}
        for a in activity.values():
            if a.host and a.rank is not None and len(by_host) < 10_000:
                by_host.setdefault(a.host, set()).add(a.rank)
        agents = any(s.fields.get("in_launcher") for s in signals)
        hosts_seen = {a.host for a in activity.values() if a.host}
        self.exits = collect_exits(exits, teardown_pids, by_host, agents, hosts_seen)
        self.launcher_seen = bool(exits) or any(p.family == "launcher"
                                                for p in self.problems.values())

    # --- for the families --------------------------------------------------------------
    def finding(self, p: Problem, kind: str, severity: str, summary: str, ranks: list[int],
                remedy: str | None) -> Finding:
        return make_finding(p, self.ev, kind, severity, summary, ranks, remedy)

    def context_of(self, rule: str, rank: int | None) -> dict:
        return self._context.get((rule, rank), {})

    def went_on(self, p: Problem) -> str | None:
        """For a cause its process lived well past (its family says which: a retried store
        connection, an exception a framework caught), the severity it is reported at,
        beside the causes; None for a cause."""
        meaning = MEANINGS.get(p.family)
        return meaning.went_on(p, self) if hasattr(meaning, "went_on") else None

    def first_lines_who(self, f: Finding) -> tuple | None:
        """Who printed the first line of the problem finding `f` was made of."""
        sig = next((s for p in self.problems.values() for s in p.signals[:1]
                    if f.details.get("signature") == "log/" + "/".join(map(str, p.key))), None)
        return sig.line.who if sig is not None else None

    def alive_after(self, rank: int, s: Signal) -> bool:
        a = self.ev.of_rank(rank)
        return a is not None and a.file == s.line.file and a.last_lineno > s.line.lineno + 50

    # --- the whole judgement -----------------------------------------------------------
    def findings(self) -> list[Finding]:
        raised_reports_to_their_rank(self)
        causes = [p for p in self.problems.values() if p.role == CAUSE]
        for meaning in {id(m): m for m in MEANINGS.values()}.values():
            if hasattr(meaning, "prepare"):
                causes = meaning.prepare(causes)
        out: list[tuple[int, Finding]] = []
        aside: list[tuple[int, Finding]] = []
        cause_ranks: set[int] = set()
        for p in causes:
            f = self._describe(p)
            severity = self.went_on(p)
            if severity:  # not a cause: reported beside them, explaining nothing
                f.severity = severity
                f.summary += " (the process went on afterwards)"
                aside.append((p.first.order, f))
                continue
            cause_ranks |= set(f.ranks) | p.ranks
            out.append((p.first.order, f))
        store_lost = store_after_peers_lost(self, out)
        exit_findings(self, out, cause_ranks)
        orphans_to_root_cause(self, out)
        fallback_cause(self, self.unknown, out)
        transport_to_crash(out)
        first_order, first_cause = min(out, key=lambda t: t[0]) if out else (None, None)
        for p in self.problems.values():
            f = None
            if p.role == TIMEOUT:
                earlier = first_order is not None and first_order < p.first.order
                f = self._timeout_finding(p, cause_ranks, first_cause, earlier)
            elif p.role == VICTIM:
                f = self._victim_finding(p, first_cause)
            elif p.role == "warning":  # demoted by its family (NCCL warned and went on)
                f = self._describe(p)
                f.severity = "warning"
                f.summary += " (NCCL warned and went on: not necessarily the failure)"
            elif p.role == BENIGN and p.rule == "warn":
                f = self.finding(p, "comm_error", "info", f"NCCL WARN: {p.field('message', '')}",
                                 [], "Rerun with NCCL_DEBUG=INFO for this warning's context.")
            if f is not None:
                out.append((p.first.order, f))
        said_beside(out, store_lost)
        out = one_unexplained_watchdog(fold_stuck_ranks(out)) + aside
        fold_restarts(out, self.restarts)
        out.sort(key=lambda t: (_SEVERITY[t[1].severity], t[0]))
        # (a launcher's report may sit half a place before the entry it was read from)
        self.first_lines = {id(f): self._by_order[math.ceil(o)].line for o, f in out
                            if math.ceil(o) in self._by_order}
        return [f for _, f in out]

    def _describe(self, p: Problem) -> Finding:
        meaning = MEANINGS.get(p.family)
        if meaning is None or not hasattr(meaning, "describe"):
            return self.finding(p, "comm_error", "error", p.rule.replace("_", " "),
                                sorted(p.ranks), None)
        return meaning.describe(p, self)

    # --- timeouts ----------------------------------------------------------------------
    def _timeout_finding(self, p: Problem, cause_ranks: set[int], first_cause: Finding | None,
                         earlier: bool) -> Finding | None:
        reporters = sorted(p.ranks)
        meaning = MEANINGS.get(p.family)
        text, remedy = getattr(meaning, "TIMEOUTS", {}).get(
            p.rule, (lambda q: q.rule.replace("_", " "), R.FIND_LATE_RANK))
        what = text(p)
        reported = f" on rank{plural(reporters)} {ranks_text(reporters)}" if reporters else ""
        explained = cause_ranks - set(reporters)
        if first_cause is not None and (explained or not cause_ranks or earlier):
            self._add_consequence(first_cause, p, f"{what}{reported}")
            return None
        kind = "comm_error" if p.rule in getattr(meaning, "NOT_A_HANG", ()) else "hang"
        owned = meaning.owners(p, self) if hasattr(meaning, "owners") else None
        if owned:
            ranks, clause = owned
            return self.finding(p, kind, "error", f"{what}{reported}{clause}", ranks, remedy)
        behind = self._behind(p)
        if behind:
            last = min(n for (g, r), n in self.ev.enqueued.items() if r == behind[0])
            return self.finding(p, kind, "error", f"{what}{reported}; rank{plural(behind)} "
                                f"{ranks_text(behind)} never enqueued it (last enqueued work "
                                f"{last})", behind, remedy)
        busy = self._busy(p, reporters)
        if busy:
            rank, last = busy
            fnd = self.finding(p, "hang", "error", f"rank {rank} never reached the collective the "
                               f"others timed out on ({what}{reported}): it was still busy with "
                               f"serial work; its last output: {clip(last, 120)!r}", [rank],
                               R.SERIAL_WORK)
            fnd.details.update(family="serial_work", last_output=last)
            return fnd
        stopped = self._stopped_silent(p)
        if stopped:
            was = "was" if len(stopped) == 1 else "were"
            return self.finding(p, kind, "error", f"{what}{reported}; rank{plural(stopped)} "
                                f"{ranks_text(stopped)} never reported it and {was} still "
                                f"running when the launcher stopped the job (SIGTERM): never "
                                f"arrived", stopped, remedy)
        absent = self._absent(reporters)
        if absent:
            return self.finding(p, kind, "error", f"{what}{reported}; rank{plural(absent)} "
                                f"{ranks_text(absent)} never reported it: likely never arrived",
                                absent, remedy)
        return self.finding(p, kind, "error", f"{what}{reported}; which rank never arrived is "
                            f"not in this log", [],
                            R.SETTLE_ABSENCE if p.family in ("nccl", "gloo") else remedy)

    def _behind(self, p: Problem) -> list[int]:
        """Ranks whose last enqueued work (the watchdog's and dump lines') is before it."""
        seq = p.field("seq")
        if seq is None:
            return []
        pgs = {pg_of(s) for s in p.signals}
        return sorted({r for (g, r), n in self.ev.enqueued.items()
                       if g in pgs and n < seq and r not in p.ranks})

    def _busy(self, p: Problem, reporters: list[int]) -> tuple[int, str] | None:
        """A rank that kept printing after the others timed out and never reported it."""
        last_report = max(s.line.lineno for s in p.signals)
        files = {s.line.file for s in p.signals}
        busy = []
        for rank in sorted(self.ev.ranks - set(reporters)):
            a = self.ev.of_rank(rank)
            if a is None or a.file not in files or a.last_lineno <= p.first.line.lineno:
                continue
            # its own output, not a failure it printed (a timeout of another group)
            if a.last_text and not _FAILURE_TEXT.search(a.last_text):
                busy.append((a.last_lineno - last_report, rank, a.last_text))
        complete = self.ev.world is not None and len(reporters) >= self.ev.world - 1
        if len(busy) == 1 or (busy and not complete):
            _, rank, text = max(busy)
            return rank, text
        # progress printed with no rank prefix that moved on after the others timed out: the
        # one rank not waiting printed it (a world of N with N-1 reporters; or ranks 1..
        # waiting for rank 0, as in main_process_first)
        moved = _moved_after(self.progress.get(None, ()), p.first.line, files)
        if moved is None:
            return None
        missing = (set(every_rank(0, self.ev.world)) - set(reporters)) if self.ev.world else (
            self._unaccounted(reporters))
        return (missing.pop(), moved.text[:300]) if len(missing) == 1 else None

    def _unaccounted(self, reporters: list[int]) -> set[int]:
        """With the world unknown: the ranks between the lowest and highest label the log
        shows (ranks are numbered without gaps) that did not report; rank 0 when ranks
        1..N all reported (main_process_first)."""
        if not reporters:
            return set()
        if 0 not in reporters and reporters == list(every_rank(1, max(reporters) + 1)):
            return {0}
        seen = self.ev.ranks | set(reporters)
        return set(every_rank(min(seen), max(seen) + 1)) - set(reporters)

    def _stopped_silent(self, p: Problem) -> list[int]:
        """Ranks the launcher had to stop (SIGTERM) that never reported the timeout: alive,
        and not in the collective. Only when every other rank that failed reported it, and
        the log shows the others' output (torchrun --local-ranks-filter hides ranks)."""
        silent = [r for r in self.exits if r >= 0 and r not in p.ranks]
        stopped = sorted(r for r in silent if self.exits[r].get("torn_down"))
        if not p.ranks or len(stopped) != len(silent):
            return []
        shown = all(self.ev.of_rank(r) is not None for r in self.exits
                    if r >= 0 and r not in stopped)
        return stopped if shown and len(stopped) <= len(p.ranks) else []

    def _absent(self, reporters: list[int]) -> list[int]:
        """Ranks named from absence: only where the world is known and the log holds their
        other lines (it is complete for them)."""
        if self.ev.world is None or not reporters or self.mid_run:
            return []
        missing = sorted(set(every_rank(0, self.ev.world)) - set(reporters))
        if missing and len(missing) < self.ev.world / 2 + 1 and all(
                self.ev.of_rank(r) is not None or r in self.ev.announced for r in missing):
            return missing
        return []

    # --- victims -----------------------------------------------------------------------
    def _victim_finding(self, p: Problem, first_cause: Finding | None) -> Finding | None:
        reporters = sorted(p.ranks)
        what = getattr(MEANINGS.get(p.family), "VICTIMS", {}).get(p.rule, p.rule)
        what = what(p) if callable(what) else what  # (words from the problem's own fields)
        seen = f" (seen by rank{plural(reporters)} {ranks_text(reporters)})" if reporters else ""
        if first_cause is not None:
            self._add_consequence(first_cause, p, f"{what}{seen}")
            return None
        meaning = MEANINGS.get(p.family)
        named = meaning.victim_culprit(p, self) if hasattr(meaning, "victim_culprit") else None
        if named is not None:
            return named
        left = None if self.live else self._left(p)
        if left is not None:
            rank, last = left
            return self.finding(p, "comm_error", "error", f"rank {rank} left the job while the "
                                f"others were in a collective (it exited without an error; its "
                                f"last output: {clip(last, 100)!r}); {what}{seen}", [rank],
                                R.PEER_LEFT)
        return self.finding(p, "comm_error", "error", f"{what}{seen}; the rank that left is not "
                            f"in this log", [], R.PEER_GONE)

    def _left(self, p: Problem) -> tuple[int, str] | None:
        """The one known rank that neither lost the peer nor failed: the one that left."""
        known = self.ev.ranks | {r for r in self.exits if r >= 0} | p.ranks
        # ranks are 0..N-1: a gap in the ones seen is a rank too
        known |= set(every_rank(0, self.ev.world or (max(known) + 1 if known else 0)))
        # not a rank that failed; first a rank the launcher does not list (it exited 0), else
        # the one it stopped (SIGTERM) while that rank was still on its way out
        failed = {r for r, e in self.exits.items() if not e.get("torn_down")}
        others = known - p.ranks - failed
        unlisted = sorted(others - set(self.exits))
        pick = unlisted or sorted(others)
        if len(pick) != 1 or not p.ranks:
            return None
        a = self.ev.of_rank(pick[0])
        if a is not None and _FAILURE_TEXT.search(a.last_text):
            return None  # its last words were an error of its own: it failed, not left
        return pick[0], (a.last_text if a else "")

    def _add_consequence(self, cause: Finding, p: Problem, text: str) -> None:
        cons = cause.details.setdefault("consequences", [])
        if len(cons) < 20:
            cons.append({"rule": p.rule, "summary": text, "reporting_ranks": sorted(p.ranks),
                         "count": p.count})
        # a timeout after the cause is said; so is what the others saw of a cause that
        # names no rank (a Ray worker dead on some node): it is where to look next
        if "then" not in cause.summary and (p.role == TIMEOUT
                                            or p.role == VICTIM and not cause.ranks):
            cause.summary += f"; then {text}"


_FAILURE_TEXT = re.compile(r"SIG[A-Z]+|Exception|Traceback|Error|Killed|exitcode|[Ww]atchdog|"
                           r"[Tt]imed? ?out|NCCL|failed|Failed|ncclUniqueId|terminate|what\(\)|"
                           r"enforce fail")


def _moved_after(lines, first, files):
    """The last progress line after `first` that differs from every one before it."""
    before = {ln.text for ln in lines if ln.lineno <= first.lineno}
    after = [ln for ln in lines if ln.lineno > first.lineno and ln.file in files
             and ln.text not in before]
    return after[-1] if after else None
