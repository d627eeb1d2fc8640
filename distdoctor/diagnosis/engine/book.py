"""The engine's book of findings: how a finding is put (new, or an update said again only
when asked), the findings from other sources (the job's log) and the ones held back a few
seconds for a traced one to explain them, and the final list: merged, consequences said
as such, most severe first. A mixin of Engine (core.py), which holds the state it
reads (`found`, `_changed`, `_held`, `_now_s`, `ranks`, `straggler`, `_errors`); the
comm_error findings from the failed ops it keeps.
"""

from __future__ import annotations

from dataclasses import replace

from distdoctor.diagnosis.crashes.crash import merge_crashes, said_mid_run
from distdoctor.diagnosis.mismatches.after_mismatch import alloc_in_mismatch, is_host_alloc
from distdoctor.diagnosis.mismatches.threads import race_at_failure
from distdoctor.findings import Finding, error_text, most_severe_first

# how long a mismatch the job's output tells with no culprit waits for the traced one
# (across nodes, the collector's: digests every 0.5 s, then its own settle time)
HOLD_LOG_MISMATCH_S = 5.0
# how long an exception a running rank printed waits for that rank's end: an uncaught one
# ends it within moments (the interpreter prints it on its way out), a logged one does not
HOLD_LOG_CRASH_S = 5.0


class FindingBook:
    def _put(self, key: tuple, f: Finding, quiet_update: bool = False) -> None:
        old = self.found.get(key)
        if old is not None:
            if old.stacks and not f.stacks:
                f.stacks = old.stacks
            self.found[key] = f
            if not quiet_update and old.to_json() != f.to_json():
                self._changed.append(f)
            return
        self.found[key] = f
        self._changed.append(f)

    def take_changed(self) -> list[Finding]:
        """The findings new or changed since the last tick, taken (said by the caller)."""
        changed, self._changed = self._changed, []
        return changed

    def _judge_stragglers(self, final: bool) -> None:
        """The straggler verdicts, joined to the GPUs' readings where there are some."""
        call = self.boundary.call
        stragglers = call("straggler", self.straggler.findings, self.samples, default=[])
        if self.gpu_findings is not None and self.samples:
            try:
                stragglers = self.gpu_findings(list(self.samples), stragglers)
            except Exception as exc:  # probe data must never stop the diagnosis
                self.gpu_error = repr(exc)
        call("straggler", self._put_stragglers, stragglers, final)

    def _put_stragglers(self, stragglers: list[Finding], final: bool) -> None:
        """One finding per slow rank: the latest verdict (its program's or its host's). At
        the end, a straggler said earlier that the last verdict no longer names and that
        its whole run does not bear out is kept as info (StragglerTracker.kept_pace)."""
        judged = set()
        for f in stragglers:
            key = ("slow", tuple(f.ranks or f.details.get("slowed_ranks") or ()) or f.summary)
            judged.add(key)
            old = self.found.get(key)
            # a straggler that turns out to sit on a throttled GPU is news worth printing
            joined = old is not None and "GPU" in f.summary and "GPU" not in old.summary
            self._put(key, f, quiet_update=not joined)
        if not final:
            return
        for key in [k for k, f in self.found.items()
                    if k[0] == "slow" and k not in judged and f.kind == "straggler"]:
            settled = self.straggler.kept_pace(self.found[key])
            if settled is not None:
                self._put(key, settled, quiet_update=True)

    def _race_at_failure(self, failed: set[int]) -> None:
        """Failed ranks that had one group's collectives in flight from two threads at
        once, where no mismatch is known: that race (threads.race_at_failure) is the cause,
        found before their crashes are judged (which then follow from it)."""
        if any(k[0] == "mismatch" for k in self.found):
            return
        # (a rank whose op failed failed too, though distdoctor stopped it afterwards: the
        # failed ops the engine keeps for its comm_error findings)
        failed = failed | {ev.rank for evs in self._errors.values() for ev in evs
                           if ev.status in ("error", "timeout")}
        if not failed:
            return
        raced = race_at_failure(self._histories(), {
            r: st.exit.code if st.exit is not None and st.exit.how != "stopped" else None
            for r in failed for st in (self.ranks[r],)})
        if raced is not None:
            self._put(("mismatch", raced.group, raced.seq), raced)

    def _put_error_findings(self) -> None:
        """One comm_error finding per kind of error in a failed op (`_errors`)."""
        for f in self._error_findings():
            self._put(("comm_error", f.summary), f, quiet_update=True)

    def _error_findings(self) -> list[Finding]:
        out = []
        for evs in self._errors.values():
            # in rank order: the live engine sees ranks' errors in the order their logs
            # are read, a post-mortem in another; the finding must be the same
            evs = sorted(evs, key=lambda e: e.rank)
            ranks = sorted({e.rank for e in evs})
            first = evs[0]
            error = first.error or first.status
            out.append(Finding(
                "comm_error", "warning",
                f"{first.op} #{first.seq} in group {first.group} failed on rank(s) "
                f"{', '.join(map(str, ranks))}: {error_text(error, 200)}",
                [], first.group, first.seq,
                [{"rank": e.rank, **(e.callsite or {})} for e in evs[:4]],
                details={"reporting_ranks": ranks, "error": error[:2000],
                         "count": len(evs)},
                remedy="An error inside a collective is usually the consequence of another "
                "rank dying or disagreeing; look for crash and mismatch findings first."))
        return out

    def add_finding(self, f: Finding) -> None:
        """A finding from another source (the job's log): kept and reported like ours.
        A source that updates a finding (more ranks report it) keeps `details.signature`.
        A mismatch the log tells with no culprit (seen by the rank that received too
        much) waits a few seconds, where ranks are traced, for the traced mismatch that
        names the rank: then it is said as that one's consequence."""
        if f.kind == "mismatch" and not f.ranks and self.ranks:
            self._held.append((f, self._now_s))
            return
        if _told_crash(f):  # raised in or just after a traced mismatched op: its consequence
            f = alloc_in_mismatch(f, self._mismatches(), self._op_of) or f
        if _told_crash(f):
            if f.details.get("family") == "startup" and all(
                    r in self.ranks and self.ranks[r].latest is not None for r in f.ranks):
                # every rank printed the same exception after its first collectives (an
                # in-process restart's): not at start-up, whatever the output shows of it
                # (which op it came after is not known here: a rank still running may have
                # issued more since it printed it; merge_crashes says it of ranks that died)
                f = replace(f, details=dict(f.details))
                said_mid_run(f, None, None, [])
            # a newer version (a rank more reports it) replaces one still held: released
            # after it, the older one took its place, the ranks it added lost
            key = _external_key(f)
            self._held = [(g, since) for g, since in self._held
                          if not (_told_crash(g) and _external_key(g) == key)]
            if all(self._may_go_on(r) for r in f.ranks):
                # printed while its rank runs: "CRASH" only once the rank ends of it (a
                # job that logged an exception it handled was called crashed as it ran on)
                self._held.append((f, self._now_s))
                return
        if is_host_alloc(f) and any(self._op_of(r) is not None for r in f.ranks):
            # a CPU allocation that fails inside a collective, or just after one (the
            # buffer broadcast_object_list sizes from the lengths it just received), may
            # be of a size a peer sent (after_mismatch.py): it waits for the traced
            # mismatch, like the above
            self._held.append((f, self._now_s))
            return
        # said live once: its updates (a rank more that reports it) go to findings.json
        self._put(_external_key(f), f, quiet_update=True)

    def _held_as_settled(self, f: Finding) -> Finding:
        """A held log mismatch, said as the traced one's consequence once there is one
        (and a held allocation failure, where it was inside the mismatched op)."""
        if is_host_alloc(f):
            return alloc_in_mismatch(f, self._mismatches(), self._op_of) or f
        if any(k[0] == "mismatch" for k in self.found):
            return _as_consequence(f, "consequence_of_mismatch")
        return f

    def _survived(self, f: Finding) -> Finding:
        """A crash the job's output tells (an exception it printed) of ranks that all went
        on and exited normally: one the job handled and logged (logging.exception), not
        its end. A warning."""
        if not _told_crash(f):
            return f
        for r in f.ranks:
            st = self.ranks.get(r)
            ex = st.exit if st is not None else None
            if ex is None or ex.failed or ex.how not in ("exit", "closed"):
                return f
        return _went_on_words(f)

    def _as_ended(self, f: Finding) -> Finding:
        """A crash said "went on so far" (its rank lived past it, then), once its ranks
        have ended: judged as a crash told of ended ranks is (`_survived`), went on for
        good only where they all exited normally (a rank stopped by distdoctor, stuck
        after it printed its exception, did not)."""
        if f.details.get("went_on") != "so far" or any(self._running(r) for r in f.ranks):
            return f
        return self._survived(replace(f, severity="error", summary=f.details["told"], details={
            k: v for k, v in f.details.items() if k not in ("went_on", "told")}))

    def _mismatches(self) -> list[Finding]:
        return [g for k, g in self.found.items() if k[0] == "mismatch"]

    def _op_of(self, rank: int) -> tuple | None:
        """(group, seq) of the collective the rank was in last."""
        st = self.ranks.get(rank)
        ev = st.latest if st is not None else None
        return (ev.group, ev.seq) if ev is not None and ev.kind == "collective" else None

    def _running(self, rank: int) -> bool:
        st = self.ranks.get(rank)
        return st is not None and st.exit is None

    def _may_go_on(self, rank: int) -> bool:
        """Running, or its log closed with its exit unknown: a process that made a new
        default group (an in-process restart) closed this incarnation's log and runs on,
        and one that exits has its launcher's word on how within moments."""
        st = self.ranks.get(rank)
        return st is not None and (st.exit is None or st.exit.how == "closed")

    @property
    def holding(self) -> bool:
        """Whether findings wait here to be settled (add_finding): its ticks say them."""
        return bool(self._held)

    def says(self, f: Finding) -> bool:
        """Whether another source's finding (`add_finding`) is this engine's already:
        found, or held. Its update goes where its first version went."""
        key = _external_key(f)
        return key in self.found or any(_external_key(g) == key for g, _ in self._held)

    def _release_held(self, now_s: float | None) -> None:
        keep = []
        for f, since in self._held:
            if _told_crash(f):
                # an exception held as a crash is, once a mismatch its rank was in (or
                # had just left) is traced, that mismatch's consequence (after_mismatch.py)
                f = alloc_in_mismatch(f, self._mismatches(), self._op_of) or f
            if _told_crash(f):
                # (at the end, a rank whose end is unknown keeps the crash as told)
                running = now_s is not None and any(self._may_go_on(r) for r in f.ranks)
                if running and (since is None or now_s - since < HOLD_LOG_CRASH_S):
                    keep.append((f, since if since is not None else now_s))
                else:  # (ended: a crash only where some rank did not end normally)
                    self._put(_external_key(f), _went_on_words(f, "so far") if running
                              else self._survived(f), quiet_update=True)
                continue
            settled = self._held_as_settled(f)
            if settled is f and now_s is not None and (
                    since is None or now_s - since < HOLD_LOG_MISMATCH_S):
                keep.append((f, since if since is not None else now_s))
                continue
            self._put(_external_key(settled), settled, quiet_update=True)
        self._held = keep

    def findings(self) -> list[Finding]:
        """Every finding so far, most severe kinds first."""
        # a hang blamed on ranks later found dead is that death, not a second problem
        # (also when the death was itself a consequence: its cause is reported already)
        held = [self._held_as_settled(f) for f, _ in self._held]  # (see add_finding)
        found = [self._survived(f) for f in merge_crashes(
            [self._as_ended(f) for f in self.found.values()] + held, set(self.ranks))]
        crashes = [f for f in found if f.kind == "crash"]
        died = {r for f in crashes for r in f.ranks}
        dead = {r for f in crashes if f.severity == "error" for r in f.ranks}
        # (not a rank left alone in an extra collective: it died of being left alone)
        kept = [f for f in found
                if not (f.kind == "hang" and f.ranks and set(f.ranks) <= died
                        and f.details.get("reason") != "extra_collective")]
        # the log's "never arrived" on a rank the tracer saw computing when the job's
        # timeout fired (slow_past_timeout.py): that straggler, told from the output
        slow = {r for f in kept if f.details.get("reason") == "timeout_while_busy"
                for r in f.ranks}
        kept = [f for f in kept if not (f.kind == "hang" and f.ranks and set(f.ranks) <= slow
                                        and f.details.get("source") == "log")]
        # (or a hang whose waiters' op failed: the transport gave up on the rank that left)
        if dead or slow or any(f.details.get("reason") == "extra_collective" or (
                f.kind == "hang" and f.severity == "error" and f.ranks
                and f.details.get("failed_ranks")) for f in kept):
            # "lost a peer" in the job's output is that crash (or that exit) seen from
            # the others
            kept = [_as_consequence(f) if f.kind == "comm_error" and not f.ranks
                    and f.severity == "error" and f.details.get("source") == "log" else f
                    for f in kept]
        # the hazard of two threads on a group, said once it failed: the failure says it
        raced = {f.group for f in kept if f.severity == "error"
                 and f.details.get("reason") == "threads_share_group"}
        kept = [f for f in kept if not (f.severity == "info" and f.group in raced
                                        and f.details.get("reason") == "threads_share_group")]
        return most_severe_first(kept)


def _went_on_words(f: Finding, so_far: str | None = None) -> Finding:
    if so_far:  # said live: its rank runs on past it (what it told, kept for its end).
        # Not "not its end": a rank that printed it and called sys.exit(1) runs on too
        # while its exit hooks (an upload) or a thread left running hold it up
        return replace(f, severity="warning", summary=f"{f.summary} (its process went on "
                       f"after it, {HOLD_LOG_CRASH_S:g} s so far: an exception it handled, "
                       "or an end slow to come)",
                       details={**f.details, "went_on": so_far, "told": f.summary})
    return replace(f, severity="warning", summary=f"{f.summary} (its process went on and "
                   "exited normally: not what ended it)", details={**f.details, "went_on": True})


def _told_crash(f: Finding) -> bool:
    """An exception the job's output told, of ranks it names, as their crash."""
    return (f.kind == "crash" and f.severity == "error" and bool(f.ranks)
            and f.details.get("source") == "log")


def _external_key(f: Finding) -> tuple:
    """A source that updates a finding (more ranks report it) keeps `details.signature`."""
    return ("external", f.kind, f.details.get("signature") or f.summary)


def _as_consequence(f: Finding, of: str = "consequence_of_crash") -> Finding:
    """A log error that blames no rank, once its cause is known (a rank dead, a traced
    mismatch): a warning, not a cause."""
    return replace(f, severity="warning", details={**f.details, of: True})
