"""The engine's judgement of waits: how long a wait is normal at a call site, the
verdict on a rank others wait for (its progress: /proc readings, its GPU, its sampled
line and, for a busy rank on one line, its full stack), the long waits that completed,
and the stacks a hang finding carries (and the line read from them). A mixin of Engine
(core.py), which holds the state it reads.
"""

from __future__ import annotations

from dataclasses import replace
from itertools import islice

from distdoctor.diagnosis.hangs.progress import LONG_WAIT_MIN_S, Progress, Verdict
from distdoctor.diagnosis.hangs.stackframes import is_main_head, user_frame
from distdoctor.diagnosis.hangs.waits import completed_wait
from distdoctor.diagnosis.rendezvous import Rendezvous
from distdoctor.findings import Finding

MAX_SITES = 4096  # call sites whose longest wait is remembered
GPU_BUSY_PCT = 10  # a rank whose GPU is this busy is making progress
STACK_GAP_S = 1.0  # between the two stacks that tell a loop on one line from a call


class WaitJudge:
    def _completed(self, rv: Rendezvous) -> None:
        """A rendezvous every member finished: its call site learns how long a wait there
        can be; a long one is reported as such (a hang reported on it was a long wait)."""
        # (one per completed rendezvous: a list and one division, not a generator's)
        longest = max([e.t_end_ns - e.t_enter_ns for e in islice(rv.arrivals.values(), 64)],
                      default=0) / 1e9
        site = _site(rv)
        if longest > self.site_wait.get(site, 0.0):
            if len(self.site_wait) < MAX_SITES or site in self.site_wait:
                self.site_wait[site] = longest
        hang_key = ("hang", rv.group, rv.seq)
        reported = self.found.get(hang_key)
        if longest < LONG_WAIT_MIN_S and reported is None:
            self.found.pop(("long_wait", rv.group, rv.seq), None)
            return
        where = {}
        for r, e in rv.arrivals.items():
            pos = self.gaps.where_before(r, e.index)
            if pos is not None:
                where[r] = pos
        f = completed_wait(rv, where)
        if reported is not None:
            del self.found[hang_key]
            if f is None:  # short, but called a hang: say that it completed
                f = Finding("long_wait", "info", f"long wait: {rv.label()} completed after "
                            f"{longest:.0f} s", [], rv.group, rv.seq)
            rule = (f"--hang-timeout {self.hang_timeout_s:g} s" if self.hang_timeout_s
                    else "no progress seen")
            f.severity = "warning"
            f.summary += (f" — it was reported as a hang while in flight ({rule}); it was a "
                          f"long wait")
            f.details["reported_as_hang"] = reported.summary
        if f is not None:
            self._put(("long_wait", rv.group, rv.seq), f, quiet_update=True)

    def normal_wait(self, rv: Rendezvous) -> float | None:
        """The longest completed wait this job has shown at the rendezvous' call site."""
        return self.site_wait.get(_site(rv))

    def judge(self, rank: int, rv: Rendezvous, waited_s: float) -> Verdict:
        """The verdict on `rank`, which others have waited for `waited_s` in `rv`."""
        st = self.ranks.get(rank)
        p = self.progress.progress(rank)
        fixed_line_s = None
        in_data = False
        if st is not None:
            now_ns = self._now_ns(st, self._now_s)
            moved, seen = self.gaps.moved_ns.get(rank), self.gaps.seen_ns.get(rank)
            after_op = st.latest is None or (seen or 0) > st.latest.t_enter_ns
            if moved and seen and now_ns and after_op and (
                    self._now_s is None or (now_ns - seen) / 1e9 < 2.0):
                fixed_line_s = max(0.0, (now_ns - moved) / 1e9)
                if st.latest is not None and st.latest.t_end_ns:  # not before its last op
                    fixed_line_s = min(fixed_line_s, (now_ns - st.latest.t_end_ns) / 1e9)
            in_data = st.newest_span == "data" and st.span_open
        p = self._with_gpu(rank, p)
        verdict = self.policy.judge(waited_s, p, fixed_line_s, in_data, self.normal_wait(rv))
        if verdict.spin:
            verdict = self._confirm_spin(rank, verdict, p)
        return verdict

    def progress_summary(self, rank: int, now_s: float | None) -> list | None:
        """What a node's digest says of a rank's progress, for a collector to judge it
        by (collect/fleet.py): [busy, idle s, s since I/O, evidence, s its sampled line
        has not moved, waits for its DataLoader]; None without readings."""
        p = self._with_gpu(rank, self.progress.progress(rank))
        if not p.known:
            return None
        st = self.ranks.get(rank)
        fixed = None
        moved, seen = self.gaps.moved_ns.get(rank), self.gaps.seen_ns.get(rank)
        now_ns = self._now_ns(st, now_s) if st is not None else None
        if moved and seen and now_ns and (now_ns - seen) / 1e9 < 2.0:
            fixed = round(max(0.0, (now_ns - moved) / 1e9), 1)
        in_data = bool(st is not None and st.newest_span == "data" and st.span_open)
        return [p.busy, round(p.idle_s, 1), None if p.io_s == float("inf") else
                round(p.io_s, 1), p.evidence, fixed, in_data]

    def _with_gpu(self, rank: int, p: Progress) -> Progress:
        """A rank whose GPU works is making progress, whatever its CPU does (it may sleep
        in a blocking synchronize while a long kernel runs)."""
        sample = self.samples[-1] if self.samples else None
        if sample is None or not p.known or p.busy:
            return p
        gpu = sample.gpu_of_rank.get(rank)
        util = next((g.utilization_pct for g in sample.gpus
                     if gpu is not None and (g.uuid or f"index:{g.index}") == gpu), None)
        if not isinstance(util, (int, float)) or util < GPU_BUSY_PCT:
            return p
        return replace(p, busy=True, idle_s=0.0, evidence=f"busy: its GPU at {util:.0f}%")

    def _confirm_spin(self, rank: int, verdict: Verdict, p: Progress) -> Verdict:
        """Busy on one sampled line: a loop that never ends, or a long call into a library
        (an evaluation, `generate()`) that only looks fixed from the user's line. Two
        stacks STACK_GAP_S apart tell: the same innermost frames, a loop."""
        if self.stacks is None:
            return verdict
        now = self._now_s or 0.0
        first = self._spin_stacks.get(rank)
        if first is not None and now - first[0] < STACK_GAP_S:
            return Verdict("long_wait", p.evidence)
        try:
            text = self.stacks([rank]).get(rank)
        except Exception:
            text = None
        if not text:
            return verdict  # no stack to look at: the sampled line decides
        if first is None:
            self._spin_stacks[rank] = (now, text)
            return Verdict("long_wait", p.evidence)
        del self._spin_stacks[rank]
        if _main_frames(text) == _main_frames(first[1]):
            return verdict
        st = self.ranks.get(rank)
        now_ns = self._now_ns(st, self._now_s) if st is not None else None
        if now_ns:  # moving under one user line: look again in SPIN_S
            self.gaps.moved_ns[rank] = now_ns
        return Verdict("long_wait", f"{p.evidence}, working inside a call on one line")

    def wanted_progress(self) -> set[int]:
        """Ranks whose progress matters now: alive, outside any op, while some rank
        waits in one, or inside a group creation (the only ranks a wait can be for)."""
        if not self.watch_all_progress and not any(
                st.latest is not None and st.latest.t_end_ns is None and st.exit is None
                for st in self.ranks.values()) and not self._creation_waits_on():
            return set()
        return {r for r, st in self.ranks.items() if st.exit is None
                and (st.latest is None or st.latest.t_end_ns is not None)}

    def _place_busy(self, f: Finding) -> None:
        """Where the busy rank of a long wait is: its most sampled line since its last op."""
        for r in f.ranks:
            pos = self.gaps.where_now(r)
            if pos is None:
                continue
            f.callsites.insert(0, {"rank": r, **pos, "source": "sample"})
            f.summary += (f"; rank {r} is in {pos.get('function')} "
                          f"({pos.get('file')}:{pos.get('line')})")


    def _take_stacks(self, f: Finding) -> None:
        if self.stacks is None or not f.ranks:
            return
        try:
            f.stacks = {str(r): text for r, text in self.stacks(f.ranks).items()}
        except Exception as exc:  # a failed stack dump must not lose the finding
            f.details["stacks_error"] = repr(exc)

    def _place_culprits_by_stack(self, f: Finding) -> None:
        """A culprit outside any collective: its stack tells the line it is stuck on."""
        if not f.stacks:
            return
        for r in f.ranks:
            st = self.ranks.get(r)
            text = f.stacks.get(str(r))
            if not text or st is None or (st.latest is not None and st.latest.t_end_ns is None):
                continue
            frame = user_frame(text)
            if frame is not None and not frame["file"].startswith("/"):
                # py-spy shortens paths; the rank's own call sites know the full one
                known = [e.callsite.get("file") for e in (st.latest, st.last_done)
                         if e is not None and e.callsite and e.callsite.get("file")]
                full = [k for k in known if k.endswith("/" + frame["file"])]
                if full:
                    frame = {**frame, "file": full[0]}
            if frame is not None:
                f.callsites.insert(0, {"rank": r, **frame, "source": "stack"})
                where = f"{frame['file']}:{frame['line']} in {frame['function']}"
                f.details.setdefault("stuck_at", {})[str(r)] = where
                f.summary += f"; rank {r}'s stack is at {where}"


def _main_frames(text: str, depth: int = 6) -> list[str]:
    """The main thread's innermost frames in a stack dump (py-spy's or faulthandler's)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if is_main_head(line)), None)
    if start is None:
        return lines[:depth + 2]
    out = []
    for line in lines[start + 1:]:
        if line.startswith(("Thread ", "Process ")) or not line.strip():
            break
        out.append(line.strip())
        if len(out) >= depth:
            break
    return out


def _site(rv: Rendezvous) -> tuple:
    """A rendezvous' call site: its group, op and the first arrival's line."""
    first = next(iter(rv.arrivals.values()), None)
    cs = (first.callsite or {}) if first is not None else {}
    return (rv.group, first.op if first is not None else None, cs.get("file"), cs.get("line"))


