"""Findings for people: one line each as they appear live, a full report post-mortem."""

from __future__ import annotations

from rich.markup import escape
from rich.text import Text

from distdoctor.diagnosis.findings import Finding

STYLE = {"error": "bold red", "warning": "bold yellow", "info": "bold cyan"}
STACK_LINES = 25  # per rank in the full report; the JSON keeps them whole


def site_text(cs: dict) -> str:
    """A call-site entry of a finding as people read it: "rank 3: /abs/train.py:88 in step"."""
    where = f"{cs.get('file')}:{cs.get('line')}" if cs.get("file") else "unknown line"
    fn = f" in {cs['function']}" if cs.get("function") else ""
    return f"rank {cs.get('rank')}: {where}{fn}"


def live_line(f: Finding) -> Text:
    """The line `distdoctor run` prints when a finding appears."""
    text = Text()
    text.append(f"distdoctor: {f.kind.upper()} ", style=STYLE.get(f.severity, "bold"))
    text.append(f.summary)
    culprit_sites = [c for c in f.callsites if c.get("rank") in f.ranks and c.get("file")]
    if culprit_sites:
        text.append("\n    at " + "; ".join(site_text(c) for c in culprit_sites[:3]), style="dim")
    return text


def print_report(findings: list[Finding], console, notes: list[str] = (),
                 traced: bool = True) -> None:
    """`traced`: the findings come from a run's event logs (else only from job output)."""
    if not findings:
        console.print("[green]no findings[/]: every traced collective matched and completed"
                      if traced else "[green]no findings[/]")
    for i, f in enumerate(findings, 1):
        style = STYLE.get(f.severity, "bold")
        console.print(f"[{style}]{i}. {f.kind.upper()}[/] [dim]({f.severity})[/] "
                      f"{escape(f.summary)}")
        if f.ranks:
            console.print(f"   culprit rank(s): {', '.join(map(str, f.ranks))}")
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
