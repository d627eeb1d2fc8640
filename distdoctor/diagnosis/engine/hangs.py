"""The engine's pass over hangs: the hang, deadlock and long-wait findings of the open
rendezvous put in the book, or, where the ranks created their groups in different orders
(hangs/group_order.py), folded into that one cause. A mixin of Engine (core.py), which holds
the state it reads (`open`, `found`, `ranks`, `gaps`, `group_names`, `policy`).
"""

from __future__ import annotations

from distdoctor.diagnosis.hangs import creation_waits as CW
from distdoctor.diagnosis.hangs.creations import Made, counted, members_text
from distdoctor.diagnosis.hangs.group_order import group_order_finding, guard_of, skipped_finding
from distdoctor.diagnosis.hangs.hang import RankView, hang_findings
from distdoctor.diagnosis.hangs.member_skipped import skipped_by_members_finding, skippers
from distdoctor.diagnosis.hangs.progress import LONG_WAIT_MIN_S, STALL_S
from distdoctor.diagnosis.parting.parted import explain_hang
from distdoctor.findings import Finding, site_text

ACTIVE_RECENT_S = 1.0  # a rank active this recently is computing, on its way to an op

MAX_FOLDED = 64  # hang findings kept while folded into a group-order cause
GROUP_ORDER = ("group_order",)  # one cause: every name that disagrees is said in it


class HangPass:
    def _judge_hangs(self, views: dict[int, RankView], failed: set[int]) -> list[Finding]:
        """Put this pass's hang findings; return the hangs and deadlocks among them."""
        names = self.group_names.counter_names
        if not names.barrier and any(m is not None and counted(m.name)
                                     for m in map(self._in_barrier, self.ranks)):
            names.barrier = True  # the job runs new_group's barrier: every rank's name counts
        folding = bool(self.group_names.conflicts()) or self.group_names.skip_known
        hangs = []
        for f in hang_findings(self.open.values(), views, self.policy, failed,
                               known=lambda rv: rv.reported, familiar=self.habits.familiar,
                               judge=self.judge, normal=self.normal_wait):
            self._annotate_spans(f)
            if f.kind == "long_wait":
                if ("hang", f.group, f.seq) in self.found:
                    continue  # already called a hang: that stands while it is in flight
                self._place_busy(f)
                self._put(("long_wait", f.group, f.seq), f, quiet_update=True)
                continue
            if f.kind == "hang" and self._waits_on_busy(f, views):
                continue  # a rank inside new_group waits for a member on its way to it
            key = (f.kind, f.group, f.seq) if f.kind == "hang" else (f.kind, tuple(f.ranks))
            lw = self.found.get(("long_wait", f.group, f.seq))
            if lw is not None and lw.details.get("in_flight"):
                del self.found[("long_wait", f.group, f.seq)]  # it escalated
                f.details["was_long_wait"] = lw.summary
            old = self.found.get(key) or self._folded.get(key)
            if old is None:
                self._take_stacks(f)
            elif old.stacks:  # the finding is rebuilt each tick; its stacks were taken once
                f.stacks = old.stacks
            self._place_culprits_by_stack(f)
            if f.details.get("reason") == "timeout_while_busy":
                self._place_by_samples(f)
            f = self.boundary.call("parted", explain_hang, f, self._histories(),
                                   default=f, keep_on=True)
            hangs.append(f)
            if folding:  # a consequence of the group order: said inside that finding
                if key in self._folded or len(self._folded) < MAX_FOLDED:
                    self._folded[key] = f
            else:
                self._put(key, f, quiet_update=True)
        return hangs

    def _waits_on_busy(self, f: Finding, views: dict[int, RankView]) -> bool:
        """Every rank the hang blames is inside a group creation that a rank which has not
        begun it yet keeps waiting while it computes (in no collective, not judged hung by
        its progress): a rank slow to reach new_group, which it may yet call."""
        made, world = self.group_names.creations, set(self.ranks)
        rv = next((rv for rv in self.open.values() if (rv.group, rv.seq) == (f.group, f.seq)),
                  None)
        if rv is None or not f.ranks:
            return False
        waited = max((views[r].waited_s(ev) for r, ev in rv.arrivals.items() if r in views),
                     default=0.0)
        for r in f.ranks:
            m = made.inside(r) or self._in_barrier(r)
            if m is None:
                return False
            late = made.missing(m, world) if counted(m.name) else skippers(made, m, r, world)
            if not any(self._computing(x) and self.judge(x, rv, waited).state != "hang"
                       for x in late):
                return False
        return True

    def _computing(self, rank: int) -> bool:
        """Alive, in no op nor creation, and active within the last second by its progress
        readings: not by the newest interval alone, which two readings taken close
        together make too short to see a CPU tick in (a computing member read as idle, and
        the ranks waiting for it called hung, once in a full test run)."""
        st = self.ranks.get(rank)
        if st is None or st.exit is not None:
            return False
        p = self.progress.progress(rank)
        return (p.known and p.idle_s < ACTIVE_RECENT_S
                and (st.latest is None or st.latest.t_end_ns is not None)
                and self.group_names.creations.inside(rank) is None)

    def _place_by_samples(self, f: Finding) -> None:
        """A rank still computing when the job's timeout fired: the line its sampler last
        saw it at comes first (where its time went, not its last collective)."""
        for r in f.ranks:
            last = self.gaps.last.get(r)
            if last and last[0] and not any(c.get("source") == "stack" and c["rank"] == r
                                            for c in f.callsites):
                f.callsites.insert(0, {"rank": r, "file": last[0], "line": last[1],
                                       "function": last[2], "source": "sample"})
                f.details.setdefault("computing_at", {})[str(r)] = site_text(
                    {"file": last[0], "line": last[1], "function": last[2]})

    def _judge_group_order(self, hangs: list[Finding]) -> None:
        """One finding for the group names that stand for different ranks on different
        ranks, with the hangs that follow from it (said before it was known, they go); or, with
        no such name, one for a hang whose ranks wait inside a group creation that
        others never began."""
        names = self.group_names.conflicts()
        if not names:
            self._judge_skipped(hangs)
            return
        self._fold_hangs()
        hangs = self._hangs_or_folded(hangs)
        positions = self._positions()
        files = {cs.get("file") for cs in self.group_names.sites.values()}
        files |= {p[1] for p in positions.values() if p[1]}
        inside = self._stuck_inside()
        f = group_order_finding(self.group_names, names, positions, hangs, files,
                                set(self.ranks), bool(inside))
        old = self.found.get(GROUP_ORDER)
        if f.kind == "hang" and not hangs and (old is None or old.kind != "hang"):
            self._take_stacks(f)  # no hang said it: the ranks inside new_group
        elif old is not None and old.stacks and not f.stacks:
            f.stacks = old.stacks
        self._put(GROUP_ORDER, f, quiet_update=old is not None and old.kind == f.kind)

    def _hangs_or_folded(self, hangs: list[Finding]) -> list[Finding]:
        """This pass's hangs and deadlocks; else those folded into the cause before."""
        return [f for f in hangs if f.kind in ("hang", "deadlock")] or list(
            self._folded.values())

    def _fold_hangs(self) -> None:
        for key in [k for k in self.found if k[0] in ("hang", "deadlock")]:
            self._folded.setdefault(key, self.found.pop(key))

    def _judge_skipped(self, hangs: list[Finding]) -> None:
        """A rank a hang waits for is inside a group creation that ranks of the job never
        began: the hang's cause is that creation, skipped by them. Counter-named: any rank
        of the job that never began it; named by its members: a member that never began it
        and can no longer come to it (member_skipped.py)."""
        hangs = self._hangs_or_folded(hangs)
        made, world = self.group_names.creations, set(self.ranks)
        stuck, by_members, gone, barrier = {}, {}, {}, set()
        for r in sorted({r for f in hangs for r in f.ranks}):
            m = made.inside(r)
            if m is None and (m := self._in_barrier(r)) is not None:
                barrier.add(r)
            if m is None:
                continue
            if counted(m.name):
                if made.missing(m, world):
                    stuck[r] = m
            elif went := {x: g for x in skippers(made, m, r, world)
                          if (g := self._went_on(x, r)) is not None}:
                by_members[r] = m
                gone.update(went)
        if not stuck and not by_members:
            self._judge_creation_waits()
            return
        self.group_names.skip_known = True
        self._fold_hangs()
        if stuck:
            f = skipped_finding(self.group_names, stuck, self._positions(), hangs, world,
                                barrier & set(stuck))
        else:
            f = skipped_by_members_finding(made, by_members, gone, self._positions(), hangs,
                                           guard_of)
        self._put(GROUP_ORDER, f, quiet_update=GROUP_ORDER in self.found)

    def _went_on(self, rank: int, inside: int) -> dict | None:
        """Where `rank` went instead of a creation `inside` waits in for it, if it can no
        longer come to it: in a collective that `inside` never joined (each waits for the
        other), or ended (a clean exit; a crash is its own finding). None: it may yet come
        (computing, or waiting on others)."""
        st = self.ranks.get(rank)
        if st is None:
            return None
        if st.exit is not None and st.exit.how != "stopped":
            if st.exit.failed:
                return None
            return {"text": st.exit.describe(), "callsite": None}
        for rv in self.open.values():
            ev = rv.arrivals.get(rank)
            if ev is not None and ev.t_end_ns is None and inside in rv.missing:
                site = site_text(ev.callsite)
                return {"text": f"went on to {ev.op} #{ev.seq} in group {ev.group}"
                                + (f" at {site}" if site else "") + f" and waits there for "
                                f"rank {inside}", "callsite": ev.callsite}
        return None

    def _stuck_inside(self) -> list[int]:
        """The ranks inside a group creation for longer than a creation that only waits
        for slower ranks takes: a name already disagrees, so they will not get out."""
        bound = self.policy.fixed_s if self.policy.fixed_s is not None else STALL_S
        out = []
        for r, st in self.ranks.items():
            m = self.group_names.creations.inside(r) or self._in_barrier(r)
            now = self._now_ns(st, self._now_s) if m is not None else None
            if now is not None and (now - m.t_enter_ns) / 1e9 >= bound:
                out.append(r)
        return out

    def _positions(self) -> dict[int, tuple[str, str | None, int | None]]:
        """Where each rank is now, in words: (text, sampled file, sampled line). The file
        and line are those of a rank outside any op (its newest sampled line)."""
        out = {}
        for r, st in self.ranks.items():
            ev = st.latest
            # a rank distdoctor stopped was where it stood: that is what tells
            if st.exit is not None and st.exit.how != "stopped":
                out[r] = (st.exit.describe(), None, None)
            elif ev is not None and ev.t_end_ns is None:
                site = site_text(ev.callsite)
                out[r] = (f"in {ev.op} #{ev.seq} in group {ev.group}"
                          + (f" at {site}" if site else ""), None, None)
            elif (m := self.group_names.creations.inside(r)) is not None:
                site = site_text(m.callsite)
                out[r] = (f"in new_group({members_text(m.members)}) (its group {m.name})"
                          + (f" at {site}" if site else ""), None, None)
            elif (m := self._in_barrier(r)) is not None:
                site = site_text(m.callsite)
                out[r] = (f"in the store barrier at the end of new_group("
                          f"{members_text(m.members)}) (its group {m.name})"
                          + (f" at {site}" if site else ""), None, None)
            elif (last := self.gaps.last.get(r)) is not None and last[0]:
                out[r] = (f"at {site_text({'file': last[0], 'line': last[1]})}", last[0],
                          last[1])
        return out

    def _in_barrier(self, rank: int) -> Made | None:
        """The creation `rank` has not returned from though its group was built: it waits
        in new_group's store barrier (Creations.after_built)."""
        st = self.ranks.get(rank)
        if st is None or (st.exit is not None and st.exit.how != "stopped"):
            return None
        return self.group_names.creations.after_built(
            rank, st.latest.index if st.latest is not None else None,
            self.gaps.last.get(rank), self.gaps.seen_ns.get(rank))

    def _creation_waits_on(self) -> bool:
        """Whether a rank waits inside a group creation (or in its barrier) now."""
        return any(self.group_names.creations.inside(r) is not None
                   or self._in_barrier(r) is not None for r in self.ranks)

    def _judge_creation_waits(self) -> None:
        """Ranks inside group creation that no hang names (no collective is open): around
        a cycle of creations, a deadlock, said as the cause; held by ranks that compute and
        have not begun it, a long wait (creation_waits.py)."""
        made, world = self.group_names.creations, set(self.ranks)
        bound = self.policy.fixed_s if self.policy.fixed_s is not None else STALL_S
        stuck, barrier, waits, waited, asked = {}, set(), {}, {}, {}
        for r, st in self.ranks.items():
            m, inb = made.inside(r), False
            if m is None and (m := self._in_barrier(r)) is not None:
                inb = True
            now = self._now_ns(st, self._now_s) if m is not None else None
            if now is None:
                continue
            stuck[r], waited[r] = m, (now - m.t_enter_ns) / 1e9
            key = (m.name, m.members, inb)  # all ranks in one creation: asked once
            if key not in asked:
                asked[key] = CW.waited_for(made, m, inb, world)
            waits[r] = asked[key]
            if inb:
                barrier.add(r)
        self._creation_waits_done(stuck)
        held = {r: xs for r, xs in waits.items() if waited[r] >= bound}
        for comp in CW.cycles(held):
            self.group_names.skip_known = True
            self._fold_hangs()
            f = CW.cycle_finding(made, comp, stuck, barrier, held, self._positions(), guard_of)
            self._put(GROUP_ORDER, f, quiet_update=GROUP_ORDER in self.found)
            return
        by_group: dict[tuple, list[int]] = {}
        for r, m in stuck.items():
            if waits[r]:
                by_group.setdefault((m.name, tuple(sorted(m.members))), []).append(r)
        pending = self.__dict__.setdefault("_creation_pending", {})
        for (name, _), ranks in by_group.items():
            late = sorted({x for r in ranks for x in waits[r]})
            if not all(self._computing(x) for x in late):
                pending.pop(name, None)
                continue  # a rank that cannot come is a hang's, said where one is called
            at = {x: {"file": p[0], "line": p[1], "function": p[2]}
                  for x in late if (p := self.gaps.last.get(x)) is not None and p[0]}
            if name in pending or len(pending) < MAX_FOLDED:  # said when it completes
                pending[name] = (stuck[ranks[0]], {r: r in barrier for r in ranks}, late,
                                 max(waited[r] for r in ranks), at)
            if max(waited[r] for r in ranks) >= LONG_WAIT_MIN_S:
                self._put(("long_wait", "new_group", name), CW.long_wait_finding(
                    *pending[name]), quiet_update=True)

    def _creation_waits_done(self, stuck: dict[int, Made]) -> None:
        """The creations ranks were held in by computing ranks that they are out of now:
        a long wait, measured by the waiters' own spans where they ended inside it (a pass
        may not have come while it was past LONG_WAIT_MIN_S), said as completed."""
        waiting = {m.name for m in stuck.values()}
        pending = self.__dict__.get("_creation_pending", {})
        made = self.group_names.creations
        for name in [n for n in pending if n not in waiting]:
            m, held, late, waited, at = pending.pop(name)
            for r, in_barrier in held.items():
                x = next((y for y in made.by_rank.get(r, {}).values()
                          if y.name == name and y.members == m.members), None)
                if x is not None and x.t_end_ns is not None and not in_barrier:
                    waited = max(waited, (x.t_end_ns - x.t_enter_ns) / 1e9)
            key = ("long_wait", "new_group", name)
            if key in self.found or waited >= LONG_WAIT_MIN_S:
                f = CW.long_wait_finding(m, held, late, waited, at)
                CW.done(f)
                self._put(key, f, quiet_update=key in self.found)
