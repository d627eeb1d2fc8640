"""When each node reports to the collector, and which nodes are late: a node under
load or behind a congested management network sends its digests late or sparse. That is
a state of the node (one `host` finding per node), never evidence that its ranks hung:
the collector does not judge the ranks of a late node until its reports resume. And what
a node's report says of its ranks' progress (Engine.progress_summary), as read there."""

from __future__ import annotations

from distdoctor.diagnosis.hangs.progress import UNKNOWN, Progress
from distdoctor.findings import Finding

LATE_MIN_S = 6.0  # a report this late, and LATE_FACTOR x the node's usual gap: late
LATE_FACTOR = 5.0
ADAPT = 0.3  # how fast the usual gap follows the gaps seen (a node that stays sparse)


class NodeReports:
    def __init__(self):
        self.last: dict[str, tuple[float, float]] = {}  # host -> (last report, usual gap)

    @staticmethod
    def _late_after(gap_s: float) -> float:
        return max(LATE_MIN_S, LATE_FACTOR * gap_s)

    def came(self, host: str, now_s: float) -> Finding | None:
        """A node's report came; the finding saying it was late, if it was."""
        last = self.last.get(host)
        if last is None:
            self.last[host] = (now_s, 1.0)
            return None
        gap = now_s - last[0]
        # the usual gap follows the gaps seen, a late one counted as at most 10x the
        # usual: a node that stays sparse is soon judged by its new cadence
        usual = (1 - ADAPT) * last[1] + ADAPT * min(gap, 10 * last[1])
        self.last[host] = (now_s, usual)
        if gap <= self._late_after(last[1]):
            return None
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
