"""The engine's pass over hangs: the hang, deadlock and long-wait findings of the open
rendezvous put in the book, or, where the ranks created their groups in different orders
(hangs/group_order.py), folded into that one cause. A mixin of Engine (core.py), which holds
the state it reads (`open`, `found`, `ranks`, `gaps`, `group_names`, `policy`).
"""

from __future__ import annotations

from distdoctor.diagnosis.hangs.group_order import group_order_finding
from distdoctor.diagnosis.hangs.hang import RankView, hang_findings
from distdoctor.diagnosis.parting.parted import explain_hang
from distdoctor.findings import Finding, site_text

MAX_FOLDED = 64  # hang findings kept while folded into a group-order cause


class HangPass:
    def _judge_hangs(self, views: dict[int, RankView], failed: set[int]) -> list[Finding]:
        """Put this pass's hang findings; return the hangs and deadlocks among them."""
        folding = bool(self.group_names.conflicts())
        hangs = []
        for f in hang_findings(self.open.values(), views, self.policy, failed,
                               known=lambda rv: rv.reported, familiar=self._familiar,
                               judge=self.judge, normal=self.normal_wait):
            self._annotate_spans(f)
            if f.kind == "long_wait":
                if ("hang", f.group, f.seq) in self.found:
                    continue  # already called a hang: that stands while it is in flight
                self._place_busy(f)
                self._put(("long_wait", f.group, f.seq), f, quiet_update=True)
                continue
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
        """One finding per group name that stands for different ranks on different ranks,
        with the hangs that follow from it (said before it was known, they go)."""
        names = self.group_names.conflicts()
        if not names:
            return
        for key in [k for k in self.found if k[0] in ("hang", "deadlock")]:
            self._folded.setdefault(key, self.found.pop(key))
        hangs = [f for f in hangs if f.kind in ("hang", "deadlock")] or [
            f for f in self._folded.values()]
        positions = self._positions()
        files = {cs.get("file") for cs in self.group_names.sites.values()}
        files |= {p[1] for p in positions.values() if p[1]}
        for name in names:
            f = group_order_finding(self.group_names, name, positions, hangs, files)
            old = self.found.get(("group_order", name))
            self._put(("group_order", name), f,
                      quiet_update=old is not None and old.kind == f.kind)

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
            elif (last := self.gaps.last.get(r)) is not None and last[0]:
                out[r] = (f"at {site_text({'file': last[0], 'line': last[1]})}", last[0],
                          last[1])
        return out
