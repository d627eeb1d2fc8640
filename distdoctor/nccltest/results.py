"""What a sweep produces, as plain data: rows of the table, per op, per rank. No torch."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field


def combine(values: list[float], average: int) -> float:
    """Combine ranks' times as nccl-tests' -a: 0 = rank 0's, 1 = mean, 2 = min, 3 = max."""
    if not values:
        return 0.0
    if average == 0:
        return values[0]
    if average == 1:
        return sum(values) / len(values)
    return min(values) if average == 2 else max(values)


@dataclass
class GroupResult:
    """One split group's figures for one place of one row."""

    group: int
    ranks: list[int]
    time_us: float
    algbw: float
    busbw: float


@dataclass
class PlaceResult:
    """Out-of-place or in-place figures of one row."""

    time_us: float
    algbw: float
    busbw: float
    wrong: int | None  # None: not checked (-c 0)
    rank_time_us: list[float]  # every rank's own mean time per op, by global rank
    groups: list[GroupResult] = field(default_factory=list)  # only with --split


@dataclass
class Row:
    op: str
    size: int
    count: int
    dtype: str
    redop: str
    root: int
    nranks: int  # ranks in the group that ran the op
    oop: PlaceResult | None  # None: the op has no such form (printed N/A)
    ip: PlaceResult | None

    def places(self) -> list[PlaceResult]:
        return [p for p in (self.oop, self.ip) if p is not None]


@dataclass
class OpReport:
    op: str
    rows: list[Row] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # skipped sizes and combinations
    errors: int = 0  # combinations that could not run at all

    @property
    def out_of_bounds(self) -> int:
        """Results with at least one wrong element (nccl-tests' "Out of bounds values")."""
        return sum(1 for row in self.rows for p in row.places() if p.wrong)

    @property
    def avg_busbw(self) -> float:
        values = [p.busbw for row in self.rows for p in row.places()]
        return sum(values) / len(values) if values else 0.0

    def group_avg_busbw(self) -> dict[int, float]:
        per: dict[int, list[float]] = {}
        for row in self.rows:
            for place in row.places():
                for g in place.groups:
                    per.setdefault(g.group, []).append(g.busbw)
        return {g: statistics.fmean(v) for g, v in sorted(per.items())}


@dataclass
class RankInfo:
    rank: int
    local_rank: int
    host: str
    pid: int
    device: str  # "cpu", "cuda:0"
    device_name: str
    bus_id: str  # PCI bus id on GPUs, "-" on CPU
    group: int = 0
    peak_gbps: float | None = None  # NVLink peak per direction, from NVML
    peak_note: str = ""

    @classmethod
    def from_dict(cls, d: dict) -> RankInfo:
        return cls(**d)

    def to_dict(self) -> dict:
        return asdict(self)
