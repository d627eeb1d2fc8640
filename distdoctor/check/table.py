"""One row per check: what was checked, over which scope, how it went, what was found and
what to do about it. Printed as one table, or as JSON (`--json`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

STATUSES = ("ok", "warn", "fail", "n/a")  # n/a: nothing to check here (no GPU, no RDMA)
STYLE = {"ok": "green", "warn": "bold yellow", "fail": "bold red", "n/a": "dim"}


@dataclass(frozen=True)
class Row:
    check: str
    scope: str  # "job", "node vm", "rank 3", "pair 2->5"
    status: str
    found: str
    remedy: str = ""

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"unknown status {self.status!r}")


def ordered(rows: list[Row]) -> list[Row]:
    """Fails first, then warnings; otherwise in the order the checks ran."""
    rank = {"fail": 0, "warn": 1, "ok": 2, "n/a": 2}
    return sorted(rows, key=lambda r: rank[r.status])


def as_json(rows: list[Row], seconds: float, world: int | None) -> dict:
    counts = {s: sum(r.status == s for r in rows) for s in STATUSES}
    return {"format": "distdoctor-check", "version": 1, "world_size": world,
            "seconds": round(seconds, 2), "counts": counts,
            "rows": [asdict(r) for r in ordered(rows)]}


def render(rows: list[Row], console, seconds: float, world: int | None) -> None:
    from rich import box
    from rich.table import Table

    from distdoctor.safetext import for_rich

    t = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    for name in ("check", "scope", "status", "found", "remedy"):
        t.add_column(name, overflow="fold", no_wrap=name in ("check", "status"))
    for r in ordered(rows):
        # found: what a rank's collective raised (gloo's "[/pytorch/third_party/...]")
        t.add_row(for_rich(r.check), for_rich(r.scope), f"[{STYLE[r.status]}]{r.status}[/]",
                  for_rich(r.found), for_rich(r.remedy or "-"))
    console.print(t)
    counts = {s: sum(r.status == s for r in rows) for s in STATUSES}
    verdict = ("[bold red]FAIL[/]" if counts["fail"] else
               "[bold yellow]WARN[/]" if counts["warn"] else "[bold green]OK[/]")
    checked = (f"{world} rank{'s' if world != 1 else ''} checked" if world
               else "this node checked, no rank ran")
    console.print(f"{verdict}  {checked} in {seconds:.1f} s: "
                  f"{counts['ok']} ok, {counts['warn']} warn, {counts['fail']} fail, "
                  f"{counts['n/a']} n/a")
