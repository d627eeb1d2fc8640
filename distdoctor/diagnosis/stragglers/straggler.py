"""straggler: the rank the others keep waiting for.

Clock-independent (DESIGN principle 2): every rank measures its own wait in a collective
(completion - enter, on its own clock). Everyone leaves a collective at about the same
moment, so a rank that arrives late waits less than the others, by about how late it was.
The last to arrive kept everyone waiting for as long as the next-to-last waited beyond it:
that gap is its lateness in this collective; every other rank's is minus how much longer
it waited than the last one. Measuring against the next-to-last, not the typical rank,
keeps a cohort that is late together by design (the first pipeline stage at a step's
loss all-reduce) from looking like stragglers. A rank's lateness is summed per step (steptime.py: a span, the tracer's implicit optimizer
or batch steps, else one turn of the rank's repeating pattern of collectives; the tracker
reads each op's step from the engine's StepTimes, which knows nothing of it): a rank slow
once per step and one slow a little at every collective both show as a steady per-step
sum, where per-collective values are dominated by scheduling noise.

Two verdicts, each a t-statistic over the rank's recent steps:
- against zero: its mean per-step lateness is above a floor and clearly not noise;
- against its own past (onset): the steps since some step are later than the ones before
  by more than the floor (Welch's t over the split that gives the largest). This finds a
  rank that slows mid-run within a few steps, and is blind to fixed arrival offsets (gloo's
  ring order on one host, topology), which both halves share.
Groups of two are symmetric (one's lateness is the other's negative), so the verdict
comes from all the groups a rank is in together. Three more checks keep healthy jobs on
busy machines quiet: the occasional step far above the rank's typical one (an evaluation
on rank 0 every N steps) is left out (stepstats.typical); the rank's longer history, from
its onset, must be late too; and some other rank must have waited on it. The finding
then says why the rank is late (cause.py): its batches, its compute and where in the
code, or one group's link.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import replace

from distdoctor.diagnosis.rendezvous import Rendezvous
from distdoctor.diagnosis.stragglers import cause, host_noise
from distdoctor.diagnosis.stragglers.stepstats import STEPS, Steps, onset, t, typical
from distdoctor.diagnosis.stragglers.steptime import RankSteps, StepTimes
from distdoctor.diagnosis.stragglers.waitgraph import Activity, WaitGraph, delays_text
from distdoctor.findings import Finding, callsite_of

WINDOW = 400  # recent collectives per rank kept for the report
MIN_STEPS = 8  # no verdict on fewer
MIN_T = 4.0  # how many standard errors the mean per-step lateness must stand above zero
MIN_ONSET_T = 5.0  # ... and above the rank's own earlier steps (more splits are tried)
STEADY_SHARE = 0.6  # of its steps a straggler is late in (by the floor, at least)
MAX_GROUPS = 4096  # collective groups whose members are kept
MAX_PENDING_P2P = 4096  # completed p2p pairings awaiting their ranks' next activity
VICTIM_SHARE = 0.25  # a rank that waits this share of the root's lateness per step on it
# steps a rise must last to be judged: a shorter one comes and goes with the machine (a
# process the scheduler moved onto the rank's core; seen on a quiet node too: a healthy
# 2-rank job's last 5 steps, 5 ms late each, once in ~20 runs on a 2-core VM)
MIN_RISE_STEPS = 10
# its newest steps, which must be late too: a straggler keeps the others waiting now. A
# stretch of late steps that has ended is the machine's (a healthy 2-rank FSDP2 job on 2
# cores: rank 1 late 15 ms per step for 9 steps, then 4.9, 3.6, -0.9 ms, judged then)
NOW_STEPS = 3
MIN_LATENESS_MS = 5.0  # per step; below this, lateness is noise (scheduling, logging) or
# a fixed offset by design (a pipeline stage that always ends its step 2 ms after the other)


def _first(item):
    return item[0]


# One rank's part in one collective, a plain tuple (one per member of every collective; a
# tuple costs a fifth of an object): lateness_ms (how long the others waited for it,
# negative when it waited), last (it arrived last), group, callsite, p2p (a pairing)
_LATENESS, _LAST, _GROUP, _CALLSITE, _P2P = range(5)


class StragglerTracker:
    def __init__(self, min_lateness_ms: float = MIN_LATENESS_MS, window: int = WINDOW,
                 min_t: float = MIN_T, steptime: StepTimes | None = None):
        """`steptime`: where each rank's steps go, fed by the engine (its own when none)."""
        self.min_lateness_ms = min_lateness_ms
        self.window = window
        self.min_t = min_t
        self.obs: dict[int, deque[tuple]] = {}
        self.steps: dict[int, Steps] = {}
        self.steptime = StepTimes() if steptime is None else steptime
        # rank -> its steps (read by cause.py, host_noise.py and views/snapshot.py)
        self.time: dict[int, RankSteps] = self.steptime.ranks
        # rank -> the onset found while it is a straggler (the window of recent steps
        # slides past it; the finding keeps saying since when)
        self.onsets: dict[int, str] = {}
        self.onset_keys: dict[int, int] = {}  # ... and the key of that step
        self.graph = WaitGraph()  # who waited on whom, per step (waitgraph.py)
        self.activity = Activity()  # when each rank last did something (p2p waits)
        self._p2p: deque[Rendezvous] = deque()  # completed pairings awaiting that
        self.members: dict[str, frozenset] = {}  # collective group -> its ranks
        self.step_thread = self.steptime.thread  # beside.py: the step detection's rule
        self._quiet_as_of: tuple | None = None  # no late rank, and nothing fed since

    def op(self, ev) -> None:
        """A collective or p2p op of a rank (new, or its completion), in its own order."""
        self._quiet_as_of = None
        self.activity.op(ev)

    def observe(self, rv: Rendezvous) -> None:
        """Feed one completed rendezvous (every member arrived and finished). A p2p one
        waits until both ranks have done something since (their blocked time is known)."""
        self._quiet_as_of = None
        if len(rv.arrivals) < 2:
            return
        if not rv.is_p2p and self.step_thread.beside(rv):
            return  # a thread's own group at its own cadence: no step of the rank's
        if rv.is_p2p:
            self._p2p.append(rv)
            if len(self._p2p) > MAX_PENDING_P2P:
                self._judge(self._p2p.popleft())
            self._drain()
            return
        self._judge(rv)

    def _drain(self, all_: bool = False) -> None:
        pending, newest = self._p2p, self.activity.newest
        while pending:
            rv = pending[0]
            if not all_ and any(newest(r) <= (e.t_end_ns or 0) for r, e in rv.arrivals.items()):
                return  # in order: a pairing waits for the ones before it
            self._judge(pending.popleft())

    def _judge(self, rv: Rendezvous) -> None:
        arrivals, p2p = rv.arrivals, rv.is_p2p
        # a rendezvous comes here complete; an arrival without an end is still no wait to
        # compare, whatever handed it here (it would be a subtraction from None)
        if p2p:  # a send and its recv: leave together only when both block (Activity)
            blocked = self.activity.blocked_ns
            waits = [(blocked(e), r, e) for r, e in arrivals.items() if e.t_end_ns is not None]
        else:  # every member leaves a collective at about the same moment
            if rv.group not in self.members and len(self.members) < MAX_GROUPS:
                self.members[rv.group] = frozenset(rv.members)
            waits = [(e.t_end_ns - e.t_enter_ns, r, e) for r, e in arrivals.items()
                     if e.t_end_ns is not None]
        if len(waits) < 2:
            return
        if len(waits) > 2:
            waits.sort(key=_first)
        elif waits[1][0] < waits[0][0]:  # two: the stable sort's order without its call
            waits.reverse()
        w_last, last = waits[0][0], waits[0][1]
        gap = (waits[1][0] - w_last) / 1e6
        obs, steps, group = self.obs, self.steps, rv.group
        via = None
        place = self.steptime.place
        for w, rank, ev in waits:
            q = obs.get(rank)
            if q is None:
                q = self._observer(rank)
            is_last = rank == last
            lateness = gap if is_last else (w_last - w) / 1e6
            q.append((lateness, is_last, group, ev.callsite, p2p))
            key = place(rank, ev, p2p)  # its step, which counts its time
            steps[rank].add(key, lateness)
            if not is_last and lateness < 0:  # it waited on the last to arrive
                if via is None:
                    via = "p2p" if p2p else (rv.group_desc or f"group {group}")
                self.graph.add(rank, last, key, -lateness, via)

    def _observer(self, rank: int) -> deque:  # (its first: its window, its steps' sums)
        self.steps[rank] = Steps()
        return self.obs.setdefault(rank, deque(maxlen=self.window))

    def score(self, rank: int) -> dict | None:
        q, steps = self.obs.get(rank), self.steps.get(rank)
        if not q or steps is None:
            return None
        history = steps.long_sums
        window = history[-STEPS:]
        if len(window) < MIN_STEPS:
            return None
        floor = self.min_lateness_ms
        kept = typical(window, floor)
        keys = [k for k, _ in kept]
        xs = [x for _, x in kept]
        n = len(xs)
        mean = sum(xs) / n
        t_stat = t(xs)
        per = [o[_LATENESS] for o in q]
        half = n // 2
        out = {"step_lateness_ms": mean, "t": t_stat, "steps": n,
               "lateness_ms": sum(per) / len(per), "collectives": len(per),
               "last_fraction": sum(o[_LAST] for o in q) / len(q),
               "early_mean_ms": sum(xs[:half]) / max(half, 1),
               "late_mean_ms": sum(xs[half:]) / max(n - half, 1),
               "onset": 0, "keys": keys, "series": xs,
               "occasional": len(window) - n, "history": history}
        found = onset(xs)
        if found is not None:
            split, rise, t_rise = found
            out.update(onset_split=split, rise_ms=rise, onset_t=t_rise)
        return out

    def is_straggler(self, s: dict) -> bool:
        floor = self.min_lateness_ms
        steady = (s["step_lateness_ms"] >= floor and s["t"] >= self.min_t
                  and self._steady(s["series"]))
        split = s.get("onset_split", 0)
        recent = s["series"][split:]
        # a rise, and the steps since it a straggler's by themselves (a rank that only
        # waits less than it did, as the others slow, has risen but is not late)
        risen = (s.get("rise_ms", 0) >= floor and len(recent) >= MIN_RISE_STEPS
                 and s.get("onset_t", 0) >= MIN_ONSET_T
                 and sum(recent) / len(recent) >= floor
                 and t(recent) >= self.min_t and self._steady(recent))
        if risen:
            s["onset"] = split  # late since then; else since the first step kept
        s["steady"] = steady
        now = s["series"][-NOW_STEPS:]
        return ((steady or risen) and sum(now) / len(now) >= floor
                and self._late_in_history(s))

    def _late_in_history(self, s: dict) -> bool:
        """Its longer history (LONG_STEPS, from its onset where one was found) agrees: late
        by the floor too. On a machine busy with other work, lateness moves between ranks
        in stretches of seconds, as the scheduler favours one rank's cores, then another's:
        a 60-step window can be one such stretch (a rank late 12.7 ms per step over 60
        steps, 1.9 ms over its 183), which its history, where the others took their turns,
        evens out. A rank slow by its program stays late; one slow since an onset is
        judged from it."""
        history = s["history"]
        since = s["keys"][s["onset"]] if s["onset"] else s.get("onset_key")
        if since is not None:  # (an onset older than the history: all of it is since)
            history = history[next((i for i, (k, _) in enumerate(history) if k == since), 0):]
        history = typical(history, self.min_lateness_ms)
        return sum(x for _, x in history) / len(history) >= self.min_lateness_ms

    def _onset_before_window(self, s: dict) -> int | None:
        """The key of the step where a rank late in its whole window began to be late,
        found in its longer history: on a busy machine the first verdict can come when
        the window has slid past the onset already (the live engine behind by some steps,
        or a verdict lost to a noisy stretch), and "since" its first step kept would name
        a step the rank was late long before. None where the history shows no clear rise
        before the window."""
        history = typical(s["history"], self.min_lateness_ms)
        found = onset([x for _, x in history])
        if found is None:
            return None
        split, rise, t_rise = found
        keys = [k for k, _ in history]
        if rise < self.min_lateness_ms or t_rise < MIN_ONSET_T or s["keys"][0] not in keys:
            return None
        return keys[split] if split < keys.index(s["keys"][0]) else None

    def _steady(self, xs: list) -> bool:
        """Late in most steps, not in a few long ones: lateness that comes and goes
        (another process taking the rank's core now and then) is noise, whatever its
        mean. A rank slow by its program is late step after step."""
        late = sum(1 for x in xs if x >= self.min_lateness_ms)
        return late >= STEADY_SHARE * len(xs)

    def findings(self, samples=()) -> list[Finding]:
        """One finding per root cause: a late rank whose lateness it mostly waited for
        on another late rank is that rank's victim (waitgraph.py), named in its finding.
        A rank late because its cores are busy is its host's finding (host_noise.py).
        `samples`: the probe samples of the ranks' nodes, where a front end has them."""
        quiet_as_of = (self.min_lateness_ms, self.min_t, self.window)
        if self._quiet_as_of == quiet_as_of and not self._p2p:  # (an idle job's ticks)
            return []  # what it said last time: no late rank
        self._drain()
        scores = {r: self.score(r) for r in sorted(self.obs)}
        for r, s in scores.items():
            if s is not None and r in self.onset_keys:
                s["onset_key"] = self.onset_keys[r]
        late = {r: s for r, s in scores.items() if s is not None and self.is_straggler(s)}
        for rank in [r for r in self.onsets if r not in late]:
            del self.onsets[rank]
            self.onset_keys.pop(rank, None)
        lateness = {r: s["step_lateness_ms"] for r, s in scores.items() if s is not None}
        roots: dict[int, list[int]] = {}
        for rank in late:
            roots.setdefault(self.graph.root_of(rank, lateness, late, STEPS), []).append(rank)
        out = []
        for root, chain in sorted(roots.items()):
            f = self._finding(root, late[root], scores, lateness)
            if f is None:
                continue
            also = sorted(r for r in chain if r != root)
            if also:  # late too, but through the root: its victims, not culprits
                f.details["late_through_root"] = also
            out.append(f)
        self._quiet_as_of = None if out else quiet_as_of
        return host_noise.separate(out, samples, self.time)

    def kept_pace(self, f: Finding) -> Finding | None:
        """At the end of a run, a straggler said earlier whose whole run does not bear it
        out: no longer late, and not late over its history either (a stretch early in a
        job, before there was a history to weigh it against: a healthy 2-rank FSDP2 job on
        a 2-core CI machine, rank 1 late 7.7 ms per step over steps 2-12, said live).
        Kept as info, so what was said live is not lost; None while the verdict stands."""
        steps = self.steps.get(f.ranks[0]) if len(f.ranks) == 1 else None
        history = steps.long_sums if steps is not None else []
        if f.severity != "warning" or len(history) < 2 * MIN_STEPS:
            return None
        kept = typical(history, self.min_lateness_ms)
        mean = sum(x for _, x in kept) / len(kept)
        if mean >= self.min_lateness_ms:
            return None
        return replace(f, severity="info", summary=(
            f"{f.summary}; then it kept pace: {mean:.1f} ms per step over its "
            f"{len(history)} steps, not a straggler over the run"),
            details={**f.details, "kept_pace": True, "run_lateness_ms": round(mean, 2)})

    def _finding(self, rank: int, s: dict, scores: dict, lateness: dict) -> Finding | None:
        late = [o for o in self.obs[rank] if o[_LATENESS] > 0]
        # a pipeline stage's lateness always shows in its p2p ops: not a link's sign
        groups = Counter(o[_GROUP] for o in late if not o[_P2P])
        group = groups.most_common(1)[0][0] if groups else None
        sites = Counter((o[_CALLSITE].get("file"), o[_CALLSITE].get("line"))
                        for o in late if o[_CALLSITE])
        callsite = None
        if sites:
            file, line = sites.most_common(1)[0][0]
            callsite = next(o[_CALLSITE] for o in late if o[_CALLSITE] and
                            (o[_CALLSITE].get("file"), o[_CALLSITE].get("line")) == (file, line))
        onset = s["onset"]
        since = s["keys"][onset:]
        recent = s["series"][onset:]
        per_step = sum(recent) / len(recent)
        # the waits on it since its onset (a rank slow for 5 steps delayed the others 5
        # steps, which the mean over 60 would thin to a twelfth)
        direct, through = self.graph.victims(
            rank, max(self.min_lateness_ms, VICTIM_SHARE * per_step), lateness, len(recent))
        if not direct:
            # nobody waited on it, on net: late only against its own earlier steps (in a
            # group of two, a rank that waited before and waits less now has "risen"
            # while the other still waits less than it did), not a straggler
            return None
        time = self.steptime.rank(rank)
        since_label = time.label(since[0])
        first = since[0] if onset else self._onset_before_window(s)
        if first is not None:
            self.onsets.setdefault(rank, time.label(first))
            self.onset_keys.setdefault(rank, first)
        since_label = self.onsets.get(rank, since_label)
        early, later = s["early_mean_ms"], s["late_mean_ms"]
        trend = ("rising" if later > 1.25 * early + 0.1 else
                 "falling" if early > 1.25 * later + 0.1 else "steady")
        peers = self._peers(rank)
        # what its own time must explain: the delay the ranks doing the same work see (the
        # breakdowns are compared with theirs). The per-step sum counts one delay once per
        # group it shows in, and a pipeline's bubble as well: a stage sleeping 40 ms summed
        # to 66-80 ms (p2p with its upstream stage, then its DP peer), and its 30-59 ms of
        # extra own work on a loaded machine fell under half of that ("unknown")
        peer_delay = max((ms for r, ms in direct.items() if r in peers), default=per_step)
        why = cause.explain(rank, min(per_step, peer_delay), since, self.time,
                            {r: sc["keys"][-len(since):] for r, sc in scores.items()
                             if sc is not None and r in peers},
                            {g: n / max(len(late), 1) for g, n in groups.items()},
                            self._groups_of(rank))
        when = (f"since {since_label}" if rank in self.onsets
                else f"over its last {len(recent)} steps")
        delays = delays_text(self.graph, rank, direct, through)
        summary = (f"straggler: rank {rank} keeps the others waiting {per_step:.1f} ms per "
                   f"step {when}" + (f": {why['text']}" if why["text"] else "")
                   + (f"; {delays}" if delays else "")
                   + f" (last to arrive in {s['last_fraction']:.0%} of its collectives; "
                   f"{trend})")
        details = {"lateness_ms": round(s["lateness_ms"], 3),
                   "step_lateness_ms": round(per_step, 3), "steps": len(recent),
                   "onset_step": since_label, "onset_index": onset,
                   "lateness_ms_per_step": [round(x, 2) for x in s["series"]],
                   "t_statistic": round(s["t"], 1), "last_fraction": round(s["last_fraction"], 3),
                   "collectives": s["collectives"], "trend": trend, "groups": dict(groups),
                   "cause": why["cause"], "breakdown": why["breakdown"],
                   "top_frames": why["frames"],
                   # the ranks it slows (DESIGN: in details, never in `ranks`)
                   "victims": sorted((*direct, *through)),
                   "delays": {"direct_ms_per_step": {str(r): round(ms, 1)
                                                     for r, ms in sorted(direct.items())},
                              "through_ms_per_step": {str(r): round(ms, 1)
                                                      for r, ms in sorted(through.items())},
                              "via": {str(r): self.graph.how(r, rank) for r in direct}}}
        if "onset_t" in s:
            details["onset_t_statistic"] = round(s["onset_t"], 1)
        if s["occasional"]:  # left out of the verdict (stepstats.typical)
            details["occasional_steps"] = s["occasional"]
        if why.get("own_work_ms_per_step"):  # the program's, whatever the host's load
            details["own_work_ms_per_step"] = round(why["own_work_ms_per_step"], 1)
        if why.get("slow_group"):  # the group whose collectives are slow: the finding's
            group = details["slow_group"] = why["slow_group"]
        return Finding("straggler", "warning", summary, [rank], group, None,
                       [callsite_of(rank, callsite)] + why["callsites"], details=details,
                       remedy=cause.REMEDY.get(why["cause"], cause.REMEDY["unknown"]))

    def _peers(self, rank: int) -> set[int]:
        """The ranks that do the same work as `rank`: its groups' members, but for groups
        of every rank (a pipeline's stages differ in work; its DP and TP peers do not)."""
        world = set(self.obs)
        peers = set()
        for members in self.members.values():
            if rank in members and len(members) < len(world):
                peers.update(members)
        peers.discard(rank)
        return peers or world - {rank}

    def _groups_of(self, rank: int) -> set:
        return {o[_GROUP] for o in self.obs.get(rank, ())}
