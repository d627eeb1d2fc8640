"""When each node reports to the collector, and which nodes are late: a node under
load or behind a congested management network sends its digests late or sparse. That is
a state of the node (one `host` finding per node), never evidence that its ranks hung:
the collector does not judge the ranks of a late node until its reports resume. And what
a node's report says of its ranks' progress (Engine.progress_summary), as read there."""

from __future__ import annotations

from collections import OrderedDict

from distdoctor.collect.limits import MAX_HOSTS
from distdoctor.diagnosis.hangs.progress import UNKNOWN, Progress
from distdoctor.findings import Finding

LATE_MIN_S = 6.0  # a report this late, and LATE_FACTOR x the node's usual gap: late
LATE_FACTOR = 5.0
ADAPT = 0.3  # how fast the usual gap follows the gaps seen (a node that stays sparse)
# Nodes named each by a `host` finding of their own; the late reports of the others are
# counted in one more (MORE). One per node without a bound, the collector's findings of
# the digests passed what findings.json holds for one source at ~2,800 late nodes (a
# congested network at scale, or a peer that cycles host names) and from then on none was
# written: a hang between honest nodes went unsaid.
MAX_LATE_NAMED = 256
MORE = "(other nodes)"


class NodeReports:
    def __init__(self):
        # host -> (last report, usual gap), the host heard from longest ago first: past
        # MAX_HOSTS it is forgotten (comes back as new)
        self.last: OrderedDict[str, tuple[float, float]] = OrderedDict()
        self.named: set[str] = set()  # hosts said late by a finding of their own
        self.more = 0  # late reports of the others

    @staticmethod
    def _late_after(gap_s: float) -> float:
        return max(LATE_MIN_S, LATE_FACTOR * gap_s)

    def came(self, host: str, now_s: float) -> Finding | None:
        """A node's report came; the finding saying it was late, if it was."""
        last = self.last.get(host)
        if last is None:
            self.last[host] = (now_s, 1.0)
            if len(self.last) > MAX_HOSTS:
                self.last.popitem(last=False)
            return None
        self.last.move_to_end(host)
        gap = now_s - last[0]
        # the usual gap follows the gaps seen, a late one counted as at most 10x the
        # usual: a node that stays sparse is soon judged by its new cadence
        usual = (1 - ADAPT) * last[1] + ADAPT * min(gap, 10 * last[1])
        self.last[host] = (now_s, usual)
        if gap <= self._late_after(last[1]):
            return None
        if host not in self.named and len(self.named) >= MAX_LATE_NAMED:
            self.more += 1
            return Finding(  # (its words never change: said once, its numbers kept new)
                "host", "info", f"reports from nodes besides the {MAX_LATE_NAMED} named came "
                "late too (busy nodes or a congested network; details.late_reports counts "
                "them): their ranks are judged on their own positions once they resume, "
                "never on the silence", [],
                details={"host": MORE, "late_reports": self.more, "newest_host": host,
                         "late_s": round(gap, 1)})
        self.named.add(host)
        return Finding(
            "host", "info", f"{host}'s reports came {gap:.0f} s late (a busy node or a "
            "congested network delays them): its ranks are judged on their own positions "
            "once they resume, never on the silence", [],
            details={"host": host, "late_s": round(gap, 1), "usual_gap_s": round(last[1], 2)})

    def late(self, now_s: float) -> set[str]:
        """Nodes whose next report is overdue now."""
        return {h for h, (t, gap) in self.last.items() if now_s - t > self._late_after(gap)}


def sent_progress(sent, since_s: float) -> tuple[Progress, float | None, bool]:
    """(progress, seconds its sampled line has not moved, waits for its DataLoader) from
    a digest's `progress` ([busy, idle s, s since I/O, evidence, line fixed s, in data]),
    aged by `since_s` (the time since the report, bounded by the caller); unknown when
    the node sent none or something malformed."""
    try:
        busy, idle_s, io_s, evidence, fixed, in_data = sent
        progress = Progress(True, bool(busy), 0.0 if busy else float(idle_s) + since_s,
                            float("inf") if io_s is None else float(io_s) + since_s,
                            str(evidence)[:200])
        return progress, None if fixed is None else float(fixed) + since_s, bool(in_data)
    except (TypeError, ValueError, OverflowError):  # (checked as it came: digest_fields)
        return UNKNOWN, None, False
