"""Findings for people: one line each as they appear live, a full report post-mortem."""

from __future__ import annotations

from rich.text import Text

from distdoctor.findings import SEVERITY_ORDER, Finding, framework_text
from distdoctor.safetext import for_rich as escape  # a rank's or a log's words: text only
from distdoctor.safetext import printable

STYLE = {"error": "bold red", "warning": "bold yellow", "info": "bold cyan"}
STACK_LINES = 25  # per rank in the full report; the JSON keeps them whole


def site_text(cs: dict) -> str:
    """A call-site entry of a finding as people read it: "rank 3: /abs/train.py:88 in
    step", and the framework frame that issued the op for that line where one did:
    "rank 1: /abs/train.py:82 in main (trainer.fit, in Lightning's DDPStrategy.barrier)";
    no rank where none is known (a log's stack dump without rank prefixes)."""
    where = f"{cs.get('file')}:{cs.get('line')}" if cs.get("file") else "unknown line"
    fn = f" in {cs['function']}" if cs.get("function") else ""
    fw = framework_text(cs)
    via = f" ({cs['call'] + ', ' if cs.get('call') else ''}in {fw})" if fw else ""
    rank = f"rank {cs['rank']}: " if cs.get("rank") is not None else ""
    return f"{rank}{where}{fn}{via}"


def rank_ranges(ranks, among=None, limit: int = 80) -> str:
    """Ranks as people read thousands of them: 0,1,2,3,5 -> "0-3, 5"; most of `among`
    (say, every rank of the job) -> "0-4095 except 17, 2048"; past `limit` characters the
    rest is counted: "0-3, 5, 9, 12-14 (+120 more)"."""
    ranks = sorted(set(ranks))
    if among is not None and ranks:
        among = sorted(set(among))
        missing = sorted(set(among) - set(ranks))
        if (missing and set(ranks) <= set(among) and among[-1] - among[0] + 1 == len(among)
                and len(missing) < len(ranks)):
            if len(_runs(missing)) < len(_runs(ranks)):  # fewer pieces to read
                head = f"{among[0]}-{among[-1]} except "
                return head + rank_ranges(missing, limit=max(20, limit - len(head)))
    parts = _runs(ranks)
    shown, used = [], 0
    for n, part in enumerate(parts):
        if used + len(part) > limit and shown:
            left = sum(_count(p) for p in parts[n:])
            return ", ".join(shown) + f" (+{left} more)"
        shown.append(part)
        used += len(part) + 2
    return ", ".join(shown)


def _runs(ranks: list[int]) -> list[str]:
    """Sorted ranks as runs: ["0-3", "5"]."""
    parts, i = [], 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        parts.append(str(ranks[i]) if i == j else f"{ranks[i]}-{ranks[j]}")
        i = j + 1
    return parts


def _count(part: str) -> int:
    lo, _, hi = part.partition("-")
    return int(hi) - int(lo) + 1 if hi else 1


def live_line(f: Finding) -> Text:
    """The line `distdoctor run` prints when a finding appears."""
    text = Text()
    # the summary may quote what a rank or a log said: shown as text, never as control
    text.append(f"distdoctor: {printable(f.label, 40)} ", style=STYLE.get(f.severity, "bold"))
    text.append(printable(f.summary))
    culprit_sites = [c for c in f.callsites if c.get("rank") in f.ranks and c.get("file")]
    if culprit_sites:
        text.append("\n    at " + "; ".join(printable(site_text(c)) for c in culprit_sites[:3]),
                    style="dim")
    return text


class SaidOnce:
    """Which crashes `distdoctor run` has printed: a rank's death is one line, whichever
    source told it first (its traceback in the job's output, or the tracer's record of
    the raise a moment later); said again only when it grows more severe."""

    def __init__(self):
        self._crashes: dict[tuple, int] = {}  # (ranks, incarnation) -> severity said

    def new(self, f: Finding) -> bool:
        if f.kind != "crash" or not f.ranks:
            return True
        key = (tuple(f.ranks), f.details.get("incarnation"))
        severity = SEVERITY_ORDER.get(f.severity, 3)
        if key in self._crashes and self._crashes[key] <= severity:
            return False
        self._crashes[key] = severity
        return True


def print_report(findings: list[Finding], console, notes: list[str] = (),
                 traced: bool = True) -> None:
    """`traced`: the findings come from a run's event logs (else only from job output)."""
    if not findings:
        # (ops left in flight, which no finding explains, are in the notes)
        complete = traced and not any("never completed" in n for n in notes)
        console.print("[green]no findings[/]: every traced collective matched and completed"
                      if complete else "[green]no findings[/]")
    for i, f in enumerate(findings, 1):
        style = STYLE.get(f.severity, "bold")
        console.print(f"[{style}]{i}. {escape(f.label, 40)}[/] "
                      f"[dim]({escape(f.severity, 20)})[/] {escape(f.summary)}")
        if f.ranks:
            who = "busy rank(s)" if f.kind == "long_wait" else "culprit rank(s)"
            console.print(f"   {who}: {', '.join(map(str, f.ranks))}")
        for cs in f.callsites[:8]:
            console.print(f"   [dim]at[/] {escape(site_text(cs))}")
        for rank, stack in sorted(f.stacks.items(), key=lambda kv: int(kv[0])):
            lines = stack.rstrip().splitlines()
            console.print(f"   [dim]stack of rank {rank}:[/]")
            for line in lines[:STACK_LINES]:
                console.print(f"     {escape(line)}", soft_wrap=True)
            if len(lines) > STACK_LINES:
                console.print(f"     ... {len(lines) - STACK_LINES} more lines (--json)")
        if f.remedy:
            console.print(f"   [dim]try:[/] {escape(f.remedy)}")
    for note in notes:
        console.print(f"[dim]note:[/] {escape(note)}")
